"""MoeLayer.from_checkpoint on the tiny Hugging Face checkpoints of tests/data/hf: each family's
MoE block must reproduce transformers' output, saved with its input in io.safetensors
(scripts/make-hf-agreement-data). Both sides compute in f32 from the same f32 weights, so they
differ by a few 1e-7 relative; 1e-5 of the output's largest magnitude leaves a wide margin while
any layout or routing mistake shows as an error of order one."""

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest

import moe_engine

HF_DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "hf"
MAX_REL_ERROR = 1e-5
SAFETENSORS_DTYPES = {"F32": np.float32, "I32": np.int32}


def read_safetensors(path):
    """(tensors by name, metadata) of a small safetensors file: an 8-byte little-endian header
    length, a JSON header, then the raw data."""
    data = Path(path).read_bytes()
    (header_size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_size])
    body = data[8 + header_size :]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = SAFETENSORS_DTYPES[entry["dtype"]]
        tensors[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(entry["shape"])
    return tensors, metadata


def families():
    if not HF_DATA.is_dir():
        reason = (f"{HF_DATA.name} is absent: run scripts/make-hf-agreement-data where torch and "
                  "transformers are installed")
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason))]
    return sorted(d.name for d in HF_DATA.iterdir() if (d / "io.safetensors").is_file())


@pytest.mark.parametrize("family", families())
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_moe_block_matches_transformers(family, backend):
    directory = HF_DATA / family
    io, metadata = read_safetensors(directory / "io.safetensors")
    layer_index = int(metadata["layer"]) if "layer" in metadata else None
    layer = moe_engine.MoeLayer.from_checkpoint(directory, layer_index, dtype="f32",
                                                backend=backend, num_threads=2)
    hidden = np.ascontiguousarray(io["hidden_states"])
    out = layer.forward(hidden)
    assert out.shape == hidden.shape and out.dtype == np.float32
    # A token whose expert set differs (two scores tied within rounding) cannot match.
    same_experts = np.array([set(a) == set(b) for a, b in zip(layer.last_topk_ids,
                                                             io["topk_ids"])])
    assert same_experts.sum() >= len(same_experts) - 1, family
    expected = io["expected"][same_experts]
    error = np.abs(out[same_experts].astype(np.float64) - expected).max()
    scale = np.abs(expected).max()
    assert scale > 0
    assert error / scale < MAX_REL_ERROR, f"{family}: relative error {error / scale:.3g}"


def test_first_moe_layer_by_default():
    directory = HF_DATA / "olmoe"
    if not directory.is_dir():
        pytest.skip(f"{directory.name} checkpoint is absent")
    layer = moe_engine.MoeLayer.from_checkpoint(str(directory))
    explicit = moe_engine.MoeLayer.from_checkpoint(directory, 0)
    assert np.array_equal(layer.weights["w13"], explicit.weights["w13"])
    assert layer.weights["w13"].dtype == np.float32


def test_missing_directory_names_the_path(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(moe_engine.MoeError, match=re.escape(str(missing))):
        moe_engine.MoeLayer.from_checkpoint(missing)


def test_bad_dtype_and_dir():
    with pytest.raises(moe_engine.MoeError, match=r"^dtype: "):
        moe_engine.MoeLayer.from_checkpoint(HF_DATA / "olmoe", dtype="i32")
    with pytest.raises(moe_engine.MoeError, match=r"^dir: "):
        moe_engine.MoeLayer.from_checkpoint(3)
