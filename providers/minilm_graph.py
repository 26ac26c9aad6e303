"""all-MiniLM-L6-v2 as an ONNX graph, built at load time from its safetensors weights.

ONNX Runtime runs a BERT forward pass about 1.6 times cheaper than numpy on one core (its
matrix products are faster at the small sizes one sentence gives), so the local default's
fingerprint costs less of the server's CPU. No model file ships: the graph is a few dozen
plain ONNX operators made here, and the weights stay "external", handed to the session
from the numpy arrays, so no 90 MB protobuf is ever built.

What it computes is what sentence-transformers computes for this model: word + position
(+ token type 0) embeddings and LayerNorm, six encoder layers (12-head self-attention, an
exact-erf GELU feed-forward, each followed by LayerNorm), mean pooling, L2 normalisation.
The graph takes one text, `input_ids` of shape (1, tokens), with no padding: on one core a
padded batch costs more per text than texts run one by one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN = 384
HEADS = 12
LAYERS = 6
LAYER_NORM_EPS = 1e-12
OPSET = 17
IR_VERSION = 8


class _Builder:
    """Collects nodes, small constants, and the weights the graph names."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.source = weights
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.external: dict[str, np.ndarray] = {}

    def op(self, op_type: str, *inputs: str, **attributes: Any) -> str:
        out = f"{op_type.lower()}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attributes))
        return out

    def scalar(self, value: float) -> str:
        """A float constant, kept in the graph."""
        return self._constant(np.array(value, dtype=np.float32))

    def ints(self, *values: int) -> str:
        """A 1-D int64 constant (shapes, axes, slice bounds), kept in the graph."""
        return self._constant(np.array(values, dtype=np.int64))

    def _constant(self, value: np.ndarray) -> str:
        name = f"const_{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, name: str, *, transpose: bool = False) -> str:
        """A weight by its safetensors name; the graph holds only its name and shape."""
        value = self.source[name]
        if transpose:  # torch keeps a linear layer's weight as (out, in); x @ W needs (in, out)
            name, value = f"{name}.T", value.T
        if name not in self.external:
            self.external[name] = np.ascontiguousarray(value, dtype=np.float32)
            tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=value.shape)
            tensor.data_location = TensorProto.EXTERNAL
            tensor.external_data.add(key="location", value="memory")
            self.initializers.append(tensor)
        return name

    def linear(self, x: str, name: str) -> str:
        product = self.op("MatMul", x, self.weight(f"{name}.weight", transpose=True))
        return self.op("Add", product, self.weight(f"{name}.bias"))

    def layer_norm(self, x: str, name: str) -> str:
        scale, bias = self.weight(f"{name}.weight"), self.weight(f"{name}.bias")
        return self.op("LayerNormalization", x, scale, bias, axis=-1, epsilon=LAYER_NORM_EPS)

    def gelu(self, x: str) -> str:
        """x * Phi(x) with the exact erf, written the way ONNX Runtime fuses it."""
        erf = self.op("Erf", self.op("Div", x, self.scalar(math.sqrt(2.0))))
        whole = self.op("Mul", x, self.op("Add", erf, self.scalar(1.0)))
        return self.op("Mul", whole, self.scalar(0.5))

    def encoder_layer(self, x: str, prefix: str) -> str:
        head = HIDDEN // HEADS
        split = self.ints(0, 0, HEADS, head)

        def heads(name: str, order: list[int]) -> str:
            projected = self.linear(x, f"{prefix}attention.self.{name}")
            return self.op("Transpose", self.op("Reshape", projected, split), perm=order)

        q = heads("query", [0, 2, 1, 3])  # (1, heads, tokens, head)
        k = heads("key", [0, 2, 3, 1])  # (1, heads, head, tokens)
        v = heads("value", [0, 2, 1, 3])
        scores = self.op("Div", self.op("MatMul", q, k), self.scalar(math.sqrt(head)))
        context = self.op("MatMul", self.op("Softmax", scores, axis=-1), v)
        merged = self.op(
            "Reshape",
            self.op("Transpose", context, perm=[0, 2, 1, 3]),
            self.ints(0, 0, HIDDEN),
        )
        attended = self.linear(merged, f"{prefix}attention.output.dense")
        x = self.layer_norm(self.op("Add", attended, x), f"{prefix}attention.output.LayerNorm")
        inner = self.gelu(self.linear(x, f"{prefix}intermediate.dense"))
        out = self.linear(inner, f"{prefix}output.dense")
        return self.layer_norm(self.op("Add", out, x), f"{prefix}output.LayerNorm")


def build(weights: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The graph, and the arrays to hand the session for its external weights.

    Raises KeyError naming a tensor the weights lack.
    """
    # One segment only, so the token type is 0 everywhere: its row joins the positions.
    weights = dict(weights)
    weights["positions"] = (
        weights["embeddings.position_embeddings.weight"]
        + weights["embeddings.token_type_embeddings.weight"][0]
    )
    b = _Builder(weights)
    zero = b.ints(0)
    tokens = b.op("Shape", "input_ids", start=1, end=2)
    positions = b.op("Slice", b.weight("positions"), zero, tokens, zero)
    words = b.op("Gather", b.weight("embeddings.word_embeddings.weight"), "input_ids")
    hidden = b.layer_norm(b.op("Add", words, positions), "embeddings.LayerNorm")
    for i in range(LAYERS):
        hidden = b.encoder_layer(hidden, f"encoder.layer.{i}.")
    pooled = b.op("ReduceMean", hidden, axes=[1], keepdims=0)
    length = b.op("ReduceL2", pooled, axes=[1], keepdims=1)
    b.nodes.append(helper.make_node("Div", [pooled, length], ["embedding"]))
    graph = helper.make_graph(
        b.nodes,
        "all-MiniLM-L6-v2",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "tokens"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, HIDDEN])],
        initializer=b.initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    return model, b.external
