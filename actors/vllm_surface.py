"""The vLLM call surface of this code, declared once: every vLLM module, name, class member,
keyword, server flag, HTTP extension field and environment variable the engines rely on, and,
where the oldest supported vLLM (FLOOR) lacks one, the fallback the code takes instead.

The supported window is FLOOR..TESTED: FLOOR is the vLLM that the newest vllm-ascend release
pairs with (vllm-ascend 0.23.0.post1 -> vLLM 0.23.0), TESTED the one CI runs (the `cpu` extra).
tests/test_vllm_surface.py checks this list both ways: every item exists in the FLOOR wheel's
source or has a fallback, and every vLLM import, SamplingParams / LLM keyword, server flag and
VLLM_* variable the code uses is listed here. Data only: importing it imports no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FLOOR = "0.23.0"
TESTED = "0.32.0"

Kind = Literal[
    "script",  # a module run with `python -m`
    "name",  # module.Name importable (defined, re-exported or in __all__)
    "member",  # module.Class.member: a field, method or attribute of the objects vLLM hands back
    "param",  # module.Class.method.param: a keyword the method takes
    "engine_arg",  # an `LLM(...)` keyword: an LLM.__init__ parameter or an EngineArgs field
    "sampling_param",  # a SamplingParams field
    "server_flag",  # an OpenAI server command-line flag
    "http_field",  # Class.field of the OpenAI server's request / response models (found by class name)
    "route",  # an HTTP route the server answers
    "env",  # an environment variable vLLM reads (vllm/envs.py)
]


@dataclass(frozen=True)
class Item:
    kind: Kind
    name: str
    fallback: str | None = None  # what the code does without it; recorded in run.json ("fallbacks")


# Where the server lacks per-request metrics, its engine-side queue / TTFT / ITL are not known:
# the perf tables keep the client-side latencies and leave the engine_* columns null.
CLIENT_LATENCIES = "latencies from client timestamps"
PER_REQUEST_METRICS = "--enable-per-request-metrics"

SURFACE: tuple[Item, ...] = (
    # actors/vllm_engine.py: the offline engine
    Item("name", "vllm.LLM"),
    Item("name", "vllm.SamplingParams"),
    Item("name", "vllm.inputs.TokensPrompt"),
    Item("name", "vllm.sampling_params.RequestOutputKind"),
    Item("member", "vllm.sampling_params.RequestOutputKind.DELTA"),
    *(
        Item("engine_arg", a)
        for a in (
            "model",
            "tokenizer",
            "trust_remote_code",
            "dtype",
            "enforce_eager",
            "disable_log_stats",
            "seed",
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "distributed_executor_backend",  # "uni", "mp" or "ray": fleet/contracts/targets.py
            "max_logprobs",
            "max_model_len",
            "load_format",  # fleet/contracts/backend_args.py: a dummy-weights target is perf-only
            "worker_extension_cls",  # actors/vllm_worker.py: rank facts by method name
        )
    ),
    *(
        Item("sampling_param", p)
        for p in (
            "temperature",
            "max_tokens",
            "logprobs",
            "seed",
            "detokenize",
            "prompt_logprobs",
            "flat_logprobs",
            "ignore_eos",
            "output_kind",
        )
    ),
    *(
        Item("member", f"vllm.entrypoints.llm.LLM.{m}")
        for m in ("generate", "chat", "get_tokenizer", "llm_engine", "collective_rpc")
    ),
    Item("param", "vllm.entrypoints.llm.LLM.generate.use_tqdm"),
    Item("param", "vllm.entrypoints.llm.LLM.chat.use_tqdm"),
    *(
        Item("member", f"vllm.v1.engine.llm_engine.LLMEngine.{m}")
        for m in ("model_config", "engine_core", "add_request", "step", "abort_request", "has_unfinished_requests")
    ),
    Item("member", "vllm.v1.engine.core_client.EngineCoreClient.shutdown"),
    *(
        Item("member", f"vllm.config.model.ModelConfig.{m}")
        for m in ("max_logprobs", "max_model_len", "get_vocab_size")
    ),
    *(
        Item("member", f"vllm.outputs.RequestOutput.{m}")
        for m in ("request_id", "prompt", "prompt_token_ids", "prompt_logprobs", "outputs", "finished", "metrics")
    ),
    *(Item("member", f"vllm.outputs.CompletionOutput.{m}") for m in ("token_ids", "logprobs", "finish_reason")),
    Item("member", "vllm.logprobs.Logprob.logprob"),
    Item("member", "vllm.logprobs.Logprob.rank"),
    *(
        Item("member", f"vllm.v1.metrics.stats.RequestStateStats.{m}")
        for m in ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts", "num_generation_tokens")
    ),
    # actors/capture.py: the full-distribution probe reads FlatLogprobs' flat lists
    *(
        Item("member", f"vllm.logprobs.FlatLogprobs.{m}")
        for m in ("start_indices", "end_indices", "token_ids", "logprobs")
    ),
    # benchmarks/vs_vllm_bench.py: vLLM's own serving benchmark, run in-process beside fleet's perf level
    Item("name", "vllm.benchmarks.serve.add_cli_args"),
    Item("name", "vllm.benchmarks.serve.main"),
    # actors/vllm_server.py: the OpenAI server's command line and environment
    Item("script", "vllm.entrypoints.openai.api_server"),
    *(
        Item("server_flag", f)
        for f in (
            "--model",
            "--served-model-name",
            "--tokenizer",
            "--host",
            "--port",
            "--dtype",
            "--seed",
            "--max-logprobs",
            "--tensor-parallel-size",
            "--distributed-executor-backend",
            "--disable-uvicorn-access-log",
            "--max-model-len",
            "--enforce-eager",
            "--trust-remote-code",
        )
    ),
    Item("server_flag", PER_REQUEST_METRICS, fallback=CLIENT_LATENCIES),
    Item("env", "VLLM_API_KEY"),
    Item("env", "VLLM_RPC_BASE_PATH"),  # actors/reaper.py: where the engine's processes bind their IPC sockets
    # actors/openai_engine.py, actors/openai_http.py: vLLM's extensions of the OpenAI API
    *(
        Item("http_field", f"CompletionRequest.{f}")
        for f in ("return_tokens_as_token_ids", "return_token_ids", "prompt_logprobs", "ignore_eos")
    ),
    Item("http_field", "ChatCompletionRequest.return_tokens_as_token_ids"),
    Item("http_field", "ChatCompletionRequest.return_token_ids"),
    Item("http_field", "StreamOptions.continuous_usage_stats"),
    *(
        Item("http_field", f"CompletionResponseChoice.{f}")
        for f in ("prompt_token_ids", "token_ids", "prompt_logprobs")
    ),
    Item("http_field", "CompletionResponseStreamChoice.token_ids"),
    Item("http_field", "ChatCompletionResponse.prompt_token_ids"),
    Item("http_field", "ChatCompletionResponseChoice.token_ids"),
    # The per-request metrics exist only with PER_REQUEST_METRICS: same fallback.
    *(
        Item("http_field", f"{cls}.metrics", fallback=CLIENT_LATENCIES)
        for cls in ("CompletionResponse", "CompletionStreamResponse", "ChatCompletionResponse")
    ),
    *(
        Item("http_field", f"PerRequestMetrics.{f}", fallback=CLIENT_LATENCIES)
        for f in ("queue_time_ms", "time_to_first_token_ms", "generation_time_ms", "mean_itl_ms")
    ),
    Item("http_field", "ModelCard.max_model_len"),
    Item("route", "/version"),
    # fleet/contracts/backend_args.py CPU_ENV and the test / benchmark environment
    *(
        Item("env", e)
        for e in (
            "VLLM_ENABLE_V1_MULTIPROCESSING",
            "VLLM_CPU_KVCACHE_SPACE",
            "VLLM_CPU_OMP_THREADS_BIND",
            "VLLM_NO_USAGE_STATS",
        )
    ),
)


def fallback(kind: Kind, name: str) -> str | None:
    """The declared fallback of one item (None: the whole window has it)."""
    for item in SURFACE:
        if item.kind == kind and item.name == name:
            return item.fallback
    msg = f"{kind} {name!r} is not in the declared vLLM surface (actors/vllm_surface.py)"
    raise KeyError(msg)
