"""The HTTP side of the deployment: requests decoded and checked here, run by a model replica,
answered in the formats of ``codec``.

Contract:
- ``POST`` (to the application's route) runs the model on the body's inputs; ``GET`` answers the
  model's inputs and outputs and one replica's state as JSON; other methods are a 405;
- a body the formats refuse, or inputs that are not the model's (``Signature.check``), is a 4xx with
  one sentence, and never reaches a replica;
- a replica that dies or cannot be reached while it holds a request (killed, its node lost, no
  replica up yet): the request is sent again, to any replica, at most ``attempts`` times in all
  (inference has no side effect); then a 503 with ``Retry-After`` and a retriable sentence;
- every answer from a replica carries ``x-ortfuse-replica``, ``x-ortfuse-request`` (that replica's
  count of requests at its arrival), ``x-ortfuse-fused`` (``true`` when the run started on a fused
  plan), ``x-ortfuse-batch``, ``x-ortfuse-run-ms`` and ``x-ortfuse-attempts`` (sends of the request).
"""

from __future__ import annotations

import asyncio
import json
import logging

from starlette.requests import Request
from starlette.responses import Response

from ortfuse.foundation.messages import one_sentence
from ortfuse.serve import codec
from ortfuse.serve.signature import RequestError, Signature, TensorSpec

ATTEMPTS = 3  # sends of one request while replicas die under it; the delay between sends grows by RETRY_DELAY_S
RETRY_DELAY_S = 0.2
RETRY_AFTER_S = 1


class ReplicasUnavailable(RuntimeError):
    """No replica answered a request within its attempts; the message is one sentence."""


def retriable_failures() -> tuple[type[BaseException], ...]:
    """The exceptions of a request whose replica died or could not be reached: it was not answered."""
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

    return RayActorError, BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError


def signature_from_json(doc: dict) -> Signature:
    def specs(items):
        return tuple(TensorSpec(t["name"], t["dtype"], tuple(t["shape"])) for t in items)

    return Signature(specs(doc["inputs"]), specs(doc["outputs"]))


class Ingress:
    """The ingress deployment's class: ``model`` is the handle of the model deployment."""

    def __init__(self, model, attempts: int = ATTEMPTS) -> None:
        self.model = model
        self.attempts = max(1, attempts)
        self._signature: Signature | None = None

    async def __call__(self, request: Request) -> Response:
        try:
            if request.method == "GET":
                described = await self._send(lambda: self.model.describe.remote())
                return Response(json.dumps(described), media_type=codec.JSON)
            if request.method != "POST":
                raise RequestError(f"method {request.method} is not served: POST inputs to run the model, GET to read "
                                   "its inputs and outputs", 405)
            return await self._run(request)
        except RequestError as exc:
            return error_response(exc.status, str(exc), retriable=False)
        except ReplicasUnavailable as exc:
            return error_response(503, str(exc), retriable=True)
        except Exception as exc:  # a fault of the server's own: logged, and the client may send it again
            logging.getLogger(__name__).exception("ortfuse serve: request failed")
            return error_response(500, f"the server failed on this request ({one_sentence(exc)}): send it again",
                                  retriable=True)

    async def _run(self, request: Request) -> Response:
        content_type = request.headers.get("content-type")
        limit = codec.body_limit(content_type)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise codec.too_large(int(declared), content_type)
        body = await _read(request, limit, content_type)
        signature = await self._model_signature()
        feeds = codec.decode(body, content_type, signature)
        signature.check(feeds)
        attempts: list[int] = []
        reply = await self._send(lambda: self.model.infer.remote(feeds), attempts)
        reply.meta["attempts"] = len(attempts)
        if reply.status != 200:
            return error_response(reply.status, reply.message, reply.retriable, reply.meta)
        kind = codec.response_type(content_type, request.headers.get("accept"))
        return Response(codec.encode(reply.outputs, kind), media_type=kind, headers=meta_headers(reply.meta))

    async def _model_signature(self) -> Signature:
        if self._signature is None:
            self._signature = signature_from_json(await self._send(lambda: self.model.describe.remote()))
        return self._signature

    async def _send(self, call, attempts: list[int] | None = None):
        """``await call()``, sent again while the replica holding it dies (module docstring); one item is
        appended to ``attempts`` per send."""
        failures = retriable_failures()
        last: BaseException | None = None
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(RETRY_DELAY_S * attempt)
            if attempts is not None:
                attempts.append(attempt)
            try:
                return await call()
            except failures as exc:
                last = exc
        raise ReplicasUnavailable(f"no model replica answered in {self.attempts} attempts (the last: "
                                  f"{one_sentence(last) if last else 'none'}): the request was not run to the end; "
                                  f"send it again in {RETRY_AFTER_S} s")


async def _read(request: Request, limit: int, content_type: str | None) -> bytes:
    """The body, refused (413) as soon as it passes ``limit`` bytes."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise codec.too_large(size, content_type)
        chunks.append(chunk)
    return b"".join(chunks)


def meta_headers(meta: dict) -> dict[str, str]:
    names = {"replica": "x-ortfuse-replica", "request": "x-ortfuse-request", "fused": "x-ortfuse-fused",
             "batch": "x-ortfuse-batch", "run_ms": "x-ortfuse-run-ms", "attempts": "x-ortfuse-attempts"}
    return {header: str(meta[key]).lower() if isinstance(meta[key], bool) else str(meta[key])
            for key, header in names.items() if key in meta}


def error_response(status: int, message: str, retriable: bool, meta: dict | None = None) -> Response:
    headers = meta_headers(meta or {})
    if status == 503:
        headers["retry-after"] = str(RETRY_AFTER_S)
    return Response(codec.error_body(message, retriable), status_code=status, media_type=codec.JSON, headers=headers)
