"""The Tinker SDK's protobuf bodies, read and written with the SDK's own message classes (`tinker.proto`).

`forward_backward` arrives as a `ForwardBackwardRequest` proto (zstd-compressed when the client config asks, which
this service never does); `ForwardBackwardOutput` and `SampleResponse` go back as protos, because the SDK (0.38)
reads those two result types only that way (`tinker/proto/response_conv.py`, `PROTO_SUPPORTED_TYPES`).
Everything else on the wire is JSON, validated with the SDK's pydantic request types in relayrl/service/app.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relayrl.service.errors import UserError

_DTYPES = {1: np.float32, 2: np.int64, 3: np.int32}  # the proto's DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32


@dataclass
class Example:
    """One Datum of a forward/backward request: its input tokens and its loss inputs (flat arrays)."""

    tokens: list[int]
    inputs: dict[str, np.ndarray]


@dataclass
class ForwardBackwardCall:
    model_id: str
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    examples: list[Example]


def read_forward_backward(body: bytes, encoding: str | None) -> ForwardBackwardCall:
    from tinker.proto import tinker_public_pb2 as pb

    if encoding == "zstd":
        import zstandard

        body = zstandard.ZstdDecompressor().decompress(body)
    msg = pb.ForwardBackwardRequest()
    msg.ParseFromString(body)
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    examples = [_example(i, datum) for i, datum in enumerate(msg.data)]
    return ForwardBackwardCall(msg.model_id, msg.loss_fn, config, msg.forward_only, examples)


def _example(index: int, datum) -> Example:
    tokens: list[int] = []
    for chunk in datum.model_input:
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise UserError(
                f"data[{index}].model_input: only token chunks are served here, not {chunk.WhichOneof('chunk')}"
            )
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
    inputs = {}
    for name, tensor in datum.loss_fn_inputs.items():
        if tensor.HasField("sparse_csr"):
            raise UserError(
                f"data[{index}].loss_fn_inputs[{name!r}]: sparse tensors are not served here; send it dense"
            )
        dtype = _DTYPES.get(tensor.dtype)
        if dtype is None:
            raise UserError(f"data[{index}].loss_fn_inputs[{name!r}]: unsupported dtype {tensor.dtype}")
        inputs[name] = np.frombuffer(tensor.dense, dtype=dtype).copy()
    return Example(tokens, inputs)


def forward_backward_output(per_datum: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A `ForwardBackwardOutput` proto: one ArrayRecord batching each output field's per-datum float32 arrays."""
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    record = msg.loss_fn_outputs.add(num_datums=len(per_datum))
    for name in per_datum[0] if per_datum else ():
        arrays = [np.asarray(d[name], dtype=np.float32).ravel() for d in per_datum]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        record.fields[name].CopyFrom(
            pb.BatchedTensor(
                data=b"".join(a.tobytes() for a in arrays), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32
            )
        )
    return msg.SerializeToString()


@dataclass
class Sequence:
    tokens: list[int]
    logprobs: list[float] | None
    stopped: bool  # True: a stop token/string or EOS ended it; False: max_tokens did


def sample_response(sequences: list[Sequence], prompt_logprobs: list[float] | None) -> bytes:
    """A `SampleResponse` proto. `prompt_logprobs`: one per prompt token, NaN where none (position 0)."""
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.SampleResponse()
    for seq in sequences:
        out = msg.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if seq.stopped else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
        )
        if seq.logprobs is not None:
            out.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return msg.SerializeToString()
