"""PyTorch Lightning: pjrt as an accelerator, chosen by ``Trainer()`` with no argument.

Lightning has a registry of accelerators but no entry point that fills it from outside,
and several choices name their devices: "auto" tries TPU (torch_xla), MPS and CUDA and
otherwise takes the CPU; the single-device strategy puts every accelerator but CUDA and
MPS on the CPU; mixed precision autocasts on "cuda" for any accelerator but the CPU and
MPS. So ``pl.Trainer()`` trained on the CPU on a pjrt machine and said nothing. These
patches register a pjrt accelerator (under the device's name, and "pjrt" when the device
was renamed) and give it the places CUDA has. DDP needs no patch: Lightning asks c10d for
the device's default backend, which is the ``pjrt`` process group.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from . import DEVICE, device_active, device_module, patch

TESTED = ("2.6.0", "2.7.0")
DISTRIBUTION = "pytorch-lightning"
NAMES = tuple(dict.fromkeys((DEVICE, "pjrt")))  # what accelerator= accepts


def _is_ours(accelerator: object) -> bool:
    if isinstance(accelerator, str):
        return accelerator in NAMES
    registered = globals().get("PjrtAccelerator")  # defined when Lightning's accelerators are imported
    return registered is not None and isinstance(accelerator, registered)


def parse_devices(devices: int | str | list[int] | tuple[int, ...]) -> list[int]:
    """Lightning's `devices=`: a count (-1 or "auto": every device), "0,1", or indices. With
    more ranks than devices in a process (the CPU plugin: one device per process), rank i
    uses device i modulo the count, as the process group does under torchrun."""
    count = device_module().device_count()
    if isinstance(devices, str):
        text = devices.strip()
        if text in ("auto", "-1"):
            return list(range(count))
        if "," in text:
            return [int(d) for d in text.split(",") if d.strip()]
        devices = int(text)
    if isinstance(devices, int):
        if devices == -1:
            return list(range(count))
        if devices < 1:
            raise ValueError(f"torch_pjrt: Lightning devices={devices!r}: ask for at least one {DEVICE} device")
        return list(range(devices))
    indices = [int(d) for d in devices]
    if not indices:
        raise ValueError(f"torch_pjrt: Lightning devices={devices!r}: no {DEVICE} device named")
    return indices


def _define_accelerator(base: type) -> type:
    class PjrtAccelerator(base):  # type: ignore[misc, valid-type]
        """Lightning's accelerator for torch_pjrt's device (any PJRT plugin)."""

        def setup_device(self, device: torch.device) -> None:
            if device.type != DEVICE:
                raise ValueError(f"torch_pjrt: the {DEVICE} accelerator was given the device {device}")
            device_module().set_device(device.index or 0)

        def get_device_stats(self, device: Any) -> dict[str, Any]:
            return dict(device_module().memory_stats(device))

        def teardown(self) -> None:
            pass

        @staticmethod
        def parse_devices(devices: Any) -> list[int]:
            return parse_devices(devices)

        @staticmethod
        def get_parallel_devices(devices: Any) -> list[torch.device]:
            count = max(1, device_module().device_count())
            return [torch.device(DEVICE, i % count) for i in parse_devices(devices)]

        @staticmethod
        def auto_device_count() -> int:
            return device_module().device_count()

        @staticmethod
        def is_available() -> bool:
            return device_module().is_available()

        @staticmethod
        def name() -> str:
            return DEVICE

        @classmethod
        def register_accelerators(cls, accelerator_registry: Any) -> None:
            for name in NAMES:
                if name not in accelerator_registry:
                    accelerator_registry.register(name, cls, description=cls.__doc__)

    PjrtAccelerator.__module__ = __name__
    PjrtAccelerator.__qualname__ = "PjrtAccelerator"
    return PjrtAccelerator


@patch("lightning.accelerator", "pytorch_lightning.accelerators", DISTRIBUTION, TESTED,
       "Lightning's accelerator registry is filled from its own modules only: accelerator='pjrt' was refused")
def _register(accelerators: ModuleType) -> None:
    cls = _define_accelerator(accelerators.Accelerator)
    globals()["PjrtAccelerator"] = cls
    cls.register_accelerators(accelerators.AcceleratorRegistry)


@patch("lightning.auto_accelerator", "pytorch_lightning.trainer.connectors.accelerator_connector", DISTRIBUTION,
       TESTED, "accelerator='auto' tries TPU, MPS and CUDA, then takes the CPU: Trainer() trained on the CPU "
       "on a pjrt machine, silently")
def _auto_accelerator(connector: ModuleType) -> None:
    original = connector._select_auto_accelerator

    def _select_auto_accelerator() -> str:
        chosen = original()
        return DEVICE if chosen == "cpu" and device_active() else chosen

    connector._select_auto_accelerator = _select_auto_accelerator


@patch("lightning.single_device", "pytorch_lightning.trainer.connectors.accelerator_connector", DISTRIBUTION,
       TESTED, "with one device, the strategy's device is the CPU for every accelerator but CUDA and MPS: "
       "the model stayed on the CPU")
def _single_device(connector: ModuleType) -> None:
    cls = connector._AcceleratorConnector
    original = cls._choose_strategy

    def _choose_strategy(self: Any) -> Any:
        if (_is_ours(self._accelerator_flag) and self._num_nodes_flag <= 1
                and len(self._parallel_devices) <= 1):
            from pytorch_lightning.strategies import SingleDeviceStrategy

            device = self._parallel_devices[0] if self._parallel_devices else torch.device(DEVICE, 0)
            return SingleDeviceStrategy(device=device)
        return original(self)

    cls._choose_strategy = _choose_strategy


@patch("lightning.mixed_precision", "pytorch_lightning.trainer.connectors.accelerator_connector", DISTRIBUTION,
       TESTED, "'16-mixed' and 'bf16-mixed' autocast on 'cuda' for every accelerator but the CPU and MPS "
       "(and make a CUDA gradient scaler)")
def _mixed_precision(connector: ModuleType) -> None:
    cls = connector._AcceleratorConnector
    original = cls._check_and_init_precision

    def _check_and_init_precision(self: Any) -> Any:
        own_precision = (connector.FSDPStrategy, connector.DeepSpeedStrategy, connector.SingleDeviceXLAStrategy,
                         connector.XLAStrategy)
        if (_is_ours(self._accelerator_flag) and self._precision_flag in ("16-mixed", "bf16-mixed")
                and self._precision_plugin_flag is None and not isinstance(self.strategy, own_precision)):
            self._validate_precision_choice()
            return connector.MixedPrecision(self._precision_flag, DEVICE)
        return original(self)

    cls._check_and_init_precision = _check_and_init_precision


@patch("lightning.ddp_model", "pytorch_lightning.strategies.ddp", DISTRIBUTION, TESTED,
       "DDPStrategy wraps the model inside torch.cuda.stream(torch.cuda.Stream()) for every device but the CPU: "
       "DDP on pjrt failed with 'torch.cuda.Stream requires CUDA support'")
def _ddp_model(ddp: ModuleType) -> None:
    cls = ddp.DDPStrategy
    original = cls._setup_model

    def _setup_model(self: Any, model: torch.nn.Module) -> Any:
        if self.root_device.type == DEVICE:
            return ddp.DistributedDataParallel(module=model, device_ids=self.determine_ddp_device_ids(),
                                               **self._ddp_kwargs)
        return original(self, model)

    cls._setup_model = _setup_model


@patch("lightning.fsdp_accepted", "pytorch_lightning.trainer.connectors.accelerator_connector", DISTRIBUTION,
       TESTED, "strategy='fsdp' is refused for every accelerator but CUDA ('The strategy `fsdp` requires a GPU "
       "accelerator'), though FSDP itself runs on any device with a process group")
def _fsdp_accepted(connector: ModuleType) -> None:
    cls = connector._AcceleratorConnector
    original = cls._check_strategy_and_fallback

    def _check_strategy_and_fallback(self: Any) -> None:
        if not _is_ours(self._accelerator_flag):
            return original(self)
        flag = self._accelerator_flag
        self._accelerator_flag = "cuda"  # the condition of its FSDP check, and of nothing else there
        try:
            original(self)
        finally:
            self._accelerator_flag = flag

    cls._check_strategy_and_fallback = _check_strategy_and_fallback


@patch("lightning.fsdp_precision", "pytorch_lightning.trainer.connectors.accelerator_connector", DISTRIBUTION,
       TESTED, "FSDP's '16-mixed' and 'bf16-mixed' autocast on 'cuda' whatever the accelerator: the forward ran "
       "in float32 on pjrt")
def _fsdp_precision(connector: ModuleType) -> None:
    from pytorch_lightning.plugins.precision.fsdp import FSDPPrecision

    class PjrtFSDPPrecision(FSDPPrecision):  # type: ignore[misc]
        def forward_context(self) -> Any:
            if "mixed" in self.precision:
                dtype = torch.bfloat16 if self.precision == "bf16-mixed" else torch.float16
                return torch.autocast(DEVICE, dtype=dtype)
            return super().forward_context()

    PjrtFSDPPrecision.__module__ = __name__
    cls = connector._AcceleratorConnector
    original = cls._check_and_init_precision

    def _check_and_init_precision(self: Any) -> Any:
        chosen = original(self)
        if type(chosen) is FSDPPrecision and _is_ours(self._accelerator_flag):
            return PjrtFSDPPrecision(chosen.precision, chosen.scaler)
        return chosen

    cls._check_and_init_precision = _check_and_init_precision


@patch("lightning.fsdp_device_mesh", "pytorch_lightning.strategies.fsdp", DISTRIBUTION, TESTED,
       "FSDPStrategy(device_mesh=(replicas, shards)) builds its mesh on 'cuda' whatever the accelerator")
def _fsdp_device_mesh(fsdp: ModuleType) -> None:
    cls = fsdp.FSDPStrategy
    original = cls.setup_environment

    def setup_environment(self: Any) -> None:
        shape = self.kwargs.get("device_mesh")
        if not (isinstance(shape, tuple) and self.root_device.type == DEVICE):
            return original(self)
        del self.kwargs["device_mesh"]
        original(self)
        from torch.distributed.device_mesh import init_device_mesh

        self.kwargs["device_mesh"] = init_device_mesh(DEVICE, shape)

    cls.setup_environment = setup_environment
