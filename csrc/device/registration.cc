// PrivateUse1 plumbing: device guard, hooks (generator, pointers), allocator,
// and the tensor-lifecycle kernels (empty, views, copies, resize, set_).
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/set_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include "device/context.h"
#include "device/recorder.h"
#include "device/device_name.h"

namespace torch_pjrt::device {

int device_of_address(const void* p);

namespace {
thread_local int t_current_device = 0;
}  // namespace

int current_device_index() { return t_current_device; }

namespace {

struct PjrtGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kType, t_current_device); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "pjrt guard: expected a pjrt device, got ", d);
    int n = device_count_or_zero();
    TORCH_CHECK(d.index() >= 0 && (n == 0 || d.index() < n), device_name(), ": invalid device index ", int(d.index()),
                " (have ", n, " devices)");
    t_current_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { t_current_device = d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return getStream(d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return getStream(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return getStream(s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count_or_zero());
  }
  // PJRT executes in program order per device, so an event is only the device it was
  // recorded on (kept in the handle itself as index + 1, nothing allocated): waiting for
  // it waits for that device. Not for every device: in a process whose ranks are
  // threads, that would wait on the other ranks' collectives.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag) const override {
    *event = reinterpret_cast<void*>(static_cast<intptr_t>(stream.device_index()) + 1);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& s) const override { synchronize(s.device_index()); }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) synchronize(static_cast<int>(reinterpret_cast<intptr_t>(event) - 1));
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override { synchronize(d); }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, PjrtGuardImpl);

struct PjrtHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count_or_zero() > 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    static thread_local at::Generator g;
    g = default_generator(device_index < 0 ? t_current_device : device_index);
    return g;
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return make_generator(device_index < 0 ? t_current_device : device_index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    int d = device_of_address(data);
    TORCH_CHECK(d >= 0 && d < 64, device_name(), ": pointer ", data, " is not a pjrt device address");
    return at::Device(c10::DeviceType::PrivateUse1, d);
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned_host_pointer(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_host_allocator(); }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override { return runtime_ready(); }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return device_count_or_zero(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { t_current_device = d; }
  c10::DeviceIndex getCurrentDevice() const override { return t_current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    int old = t_current_device;
    t_current_device = d;
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;
};

}  // namespace

void register_hooks() {
  static PjrtHooks hooks;
  static bool done = [] {
    at::RegisterPrivateUse1HooksInterface(&hooks);
    c10::SetAllocator(c10::DeviceType::PrivateUse1, allocator());
    ir::set_dot_precision_source(&torch_matmul_precision);
    return true;
  }();
  (void)done;
}

// ---------------------------------------------------------------- storage resize

namespace {
// Grows (or shrinks) a storage, keeping its leading bytes. The storage keeps
// its state object (so ops being recorded that read it stay valid) and gets a
// fresh fake address range (addresses of live storages never overlap).
void resize_storage_bytes(const c10::Storage& storage, size_t newsize) {
  StorageState* st = state_of(storage);
  TORCH_CHECK(st, device_name(), ": resize of a storage that is not pjrt's");
  size_t oldsize = st->nbytes;
  if (newsize == oldsize) return;
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, st->device_index));
  size_t keep = std::min(oldsize, newsize);
  if (keep > 0 && st->has_contents()) {
    at::Tensor src = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(c10::DeviceType::PrivateUse1, st->device_index));
    src.unsafeGetTensorImpl()->set_storage_keep_dtype(storage);
    src.unsafeGetTensorImpl()->set_sizes_contiguous({static_cast<int64_t>(keep)});
    OpBuilder op("resize_");
    ir::Value full = op.input(src);
    if (newsize > keep) {
      ir::Value zeros = op.b().constant(ir::DType::U8, 0, {static_cast<int64_t>(newsize - keep)});
      full = op.b().concatenate({full, zeros}, 0);
    }
    op.replace_contents(st, full);
    op.run();
  } else if (st->has_contents()) {
    assign(st, nullptr, {0}, ir::DType::U8);
  }
  c10::DataPtr old = storage.unsafeGetStorageImpl()->set_data_ptr(readdress(st, newsize));
  old.release_context();  // the same state lives on behind the new pointer
  storage.unsafeGetStorageImpl()->set_nbytes(newsize);
}

void PjrtHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  resize_storage_bytes(storage, newsize);
}
}  // namespace

// ---------------------------------------------------------------- lifecycle kernels

namespace {

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<at::MemoryFormat> memory_format) {
  at::ScalarType st = dtype.value_or(at::get_default_dtype_as_scalartype());
  to_ir(st);  // rejects unsupported dtypes with a clear error
  int idx = device && device->has_index() ? device->index() : current_device_index();
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, idx));
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  return at::detail::empty_generic(size, allocator(), ks, st, memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  at::ScalarType st = dtype.value_or(at::get_default_dtype_as_scalartype());
  to_ir(st);
  int idx = device && device->has_index() ? device->index() : current_device_index();
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, idx));
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  return at::detail::empty_strided_generic(size, stride, allocator(), ks, st);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  // Shares the sizing logic with CPU; storage growth goes through the hooks.
  auto* impl = self.unsafeGetTensorImpl();
  int64_t storage_offset = impl->storage_offset();
  bool same_sizes = self.sizes().equals(size);
  if (same_sizes && !(memory_format && *memory_format != at::MemoryFormat::Preserve)) {
    return self;  // as on CPU: the same sizes keep the strides (an out= written through a transposed view)
  }
  if (!same_sizes) impl->set_sizes_contiguous(size);
  if (memory_format && *memory_format != at::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  size_t needed = at::detail::computeStorageNbytesContiguous(size, self.dtype().itemsize(), storage_offset);
  if (impl->numel() > 0 || needed > 0) {
    const c10::Storage& storage = impl->unsafe_storage();
    if (!storage) {
      c10::Storage s(c10::Storage::use_byte_size_t(), needed, allocator(), true);
      impl->set_storage_keep_dtype(s);
    } else if (needed > storage.nbytes()) {
      resize_storage_bytes(storage, needed);
    }
  }
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t new_size = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return self.set_(source, 0, {new_size}, {});
}

at::Tensor& set_source_storage_offset(at::Tensor& self, c10::Storage source, c10::SymInt storage_offset,
                                      c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  at::native::checkSetStorage(self, source, storage_offset, size, stride);
  self.unsafeGetTensorImpl()->set_storage_offset(storage_offset.expect_int());
  std::optional<c10::IntArrayRef> stride_opt =
      stride.data() != nullptr ? std::optional<c10::IntArrayRef>(C10_AS_INTARRAYREF_SLOW(stride)) : std::nullopt;
  at::native::resize_impl_cpu_(self.unsafeGetTensorImpl(), C10_AS_INTARRAYREF_SLOW(size), stride_opt,
                               /*resize_storage=*/false);
  return self;
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return self.set_(source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage s(c10::Storage::use_byte_size_t(), 0, allocator(), true);
  return self.set_(s, 0, {0}, {});
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);

at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (self.numel() == 0) return self;
  if (self.device().is_privateuseone() && src.device().is_privateuseone()) {
    if (self.device() != src.device()) {
      // Between devices: the plugin's device-to-device copy, then a copy on the destination
      // (dtype, broadcast, views); through the host where the plugin has no such copy.
      at::Tensor moved = to_device(src, self.device().index(), "copy_ between devices");
      if (moved.defined()) return self.copy_(moved);
      copy_from_cpu(self, to_cpu(src));
      return self;
    }
    // input() and write() apply conj/neg bits: copies between tensors whose bits differ work as on CPU.
    OpBuilder op("copy_");
    op.write(self, op.b().broadcast_to(op.input(src), std::vector<int64_t>(self.sizes().begin(), self.sizes().end())));
    op.run();
  } else if (self.device().is_privateuseone()) {
    copy_from_cpu(self, src.device().is_cpu() ? src : src.cpu());
  } else {
    self.copy_(to_cpu(src));
  }
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor d = dst;
  copy_(d, self, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::Tensor d = dst;
  if (!d.sizes().equals(self.sizes())) d.resize_(self.sizes());
  copy_(d, self, false);
  return dst;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("copy_", copy_);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", read_scalar);
  // One in-order queue per device, and a buffer lives while a program reads it:
  // nothing to record (DDP and FSDP2 call it on side streams).
  m.impl("record_stream", [](at::Tensor&, c10::Stream) {});
}

}  // namespace torch_pjrt::device
