"""The `endpoint` backend: an OpenAI-compatible server someone else runs, reached at `base_url`.

Nothing is launched or stopped. The API key is read, inside the actor, from the environment
variable the manifest names (`api_key_env`): the manifest, run.json and the results hold only
that name, and actors/openai_http.py redacts the key from every text it returns. Set the
variable in the nodes' environment, not in the target's `env`, which run.json records.
Generation and perf work with any server that speaks the completions API with vLLM's
`return_tokens_as_token_ids`; scoring (being the reference) also needs `prompt_logprobs`.
"""

from __future__ import annotations

from typing import Any

from actors.openai_engine import OpenAIEngine
from fleet.contracts.backend_args import EndpointArgs


class EndpointEngine(OpenAIEngine):
    def __init__(self, args: EndpointArgs, *rest: Any, **kw: Any) -> None:
        super().__init__(args, *rest, **kw)
        self.args: EndpointArgs = args
        self.request_timeout_s, self.max_concurrency = args.request_timeout_s, args.max_concurrency
        self.send_token_ids = args.send_token_ids
        self.connect(args.base_url, api_key=self.key_from_env(args.api_key_env), served_model=args.served_model)

    def describe(self) -> dict[str, str]:
        """The server's identity; not this client's library versions, which say nothing about it."""
        import platform
        import socket

        keys = ("base_url", "served_model", "server_version")
        served = {k: v for k, v in super().describe().items() if k in keys}
        return served | {"client_hostname": socket.gethostname(), "python": platform.python_version()}

    def shutdown(self) -> None:
        """Nothing to stop: the server is not ours."""
