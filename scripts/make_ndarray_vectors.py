#!/usr/bin/env python3
"""Write the reference vectors for protocol/ndarray.ts (test/vectors/ndarray/).

Each case is one msgpack file written the way OpenPI's `openpi_client.msgpack_numpy.packb` writes
it: `msgpack.packb(obj, default=pack_array)` with msgpack-python's defaults (use_bin_type=True,
floats as float64, ints in their smallest encoding, dict insertion order kept). `pack_array`
below follows OpenPI's rules: object/void/complex dtypes are refused; an ndarray becomes
{b"__ndarray__": True, b"data": tobytes() (C order), b"dtype": dtype.str, b"shape": shape};
a numpy scalar becomes {b"__npgeneric__": True, b"data": item(), b"dtype": dtype.str}.

manifest.json lists every case with what a decoder must find. Array leaves are
{"$ndarray": {"dtype", "shape", "sha256" (of the C-order data bytes), and either "values" (flat,
C order) or "gen"}}; scalar leaves are {"$npgeneric": {"dtype", "value"}}. In "values", 64-bit
integers are strings (JSON numbers stop being exact at 2^53) and non-finite or negative-zero
floats are the strings "nan", "inf", "-inf", "-0". "gen" {"a", "b", "m", "scale", "offset"}
means value[i] = ((i * a + b) % m) * scale + offset for flat index i, computed in float64 and
then cast to the dtype (every generator here yields values exact in the dtype).
"reencode": false marks a case whose bytes our encoder must not reproduce (string keys, which
only decoders accept).

Run: python3 scripts/make_ndarray_vectors.py  (numpy 2.x, msgpack 1.x). Deterministic.
"""

import hashlib
import json
import math
import pathlib

import msgpack
import numpy as np

OUT = pathlib.Path(__file__).resolve().parent.parent / "test" / "vectors" / "ndarray"


def pack_array(obj):
    """msgpack `default` hook with OpenPI's msgpack_numpy rules (see the module docstring)."""
    is_numpy = isinstance(obj, (np.ndarray, np.generic))
    if is_numpy and obj.dtype.kind in ("V", "O", "c"):
        raise ValueError(f"Unsupported dtype: {obj.dtype}")
    if isinstance(obj, np.ndarray):
        out = {}
        out[b"__ndarray__"] = True
        out[b"data"] = obj.tobytes()
        out[b"dtype"] = obj.dtype.str
        out[b"shape"] = obj.shape
        return out
    if isinstance(obj, np.generic):
        out = {}
        out[b"__npgeneric__"] = True
        out[b"data"] = obj.item()
        out[b"dtype"] = obj.dtype.str
        return out
    return obj


def packb(obj) -> bytes:
    return msgpack.packb(obj, default=pack_array)


def gen(shape, dtype, a, b, m, scale=1.0, offset=0.0):
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.int64)
    flat = ((i * a + b) % m).astype(np.float64) * scale + offset
    arr = flat.astype(np.dtype(dtype)).reshape(shape)
    # the formula must be exact in the dtype, or a JS reimplementation could round differently
    assert np.array_equal(arr.astype(np.float64).ravel(), flat), (shape, dtype)
    return arr, {"a": a, "b": b, "m": m, "scale": scale, "offset": offset}


def json_value(x, kind, itemsize):
    if kind == "b":
        return bool(x)
    if kind in "iu":
        return str(int(x)) if itemsize == 8 else int(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0 and math.copysign(1.0, x) < 0:
        return "-0"
    return x


def describe(arr, g=None):
    d = {"dtype": arr.dtype.str, "shape": list(arr.shape), "sha256": hashlib.sha256(arr.tobytes()).hexdigest()}
    if g is not None:
        d["gen"] = g
    else:
        d["values"] = [json_value(x, arr.dtype.kind, arr.dtype.itemsize) for x in arr.ravel().tolist()]
    return {"$ndarray": d}


def describe_scalar(s):
    return {"$npgeneric": {"dtype": s.dtype.str, "value": json_value(s.item(), s.dtype.kind, s.dtype.itemsize)}}


# Every dtype the decoder supports, each in both byte orders where byte order means something.
DTYPE_VALUES = {
    "b1": [True, False, True, True, False],
    "i1": [0, 1, -1, 127, -128],
    "i2": [0, 1, -1, 32767, -32768, 258],
    "i4": [0, 1, -1, 2**31 - 1, -(2**31), 16909060],
    "i8": [0, 1, -1, 2**63 - 1, -(2**63), 2**53 + 1, 72623859790382856],
    "u1": [0, 1, 127, 128, 255],
    "u2": [0, 1, 65535, 258],
    "u4": [0, 1, 2**32 - 1, 16909060],
    "u8": [0, 1, 2**64 - 1, 2**53 + 1, 72623859790382856],
    "f2": [0.0, -0.0, 1.0, -2.5, 65504.0, 2.0**-24, 2.0**-14, float("inf"), float("-inf"), float("nan"), 0.1],
    "f4": [0.0, -0.0, 1.5, -3.25, 3.4028234663852886e38, 1.401298464324817e-45, float("inf"), float("nan"), 0.1],
    "f8": [0.0, -0.0, 1.5, -3.25, 1.7976931348623157e308, 5e-324, float("-inf"), float("nan"), 0.1],
}


def cases():
    """Yield (name, object to pack, expected description, reencode)."""
    a, g = gen((50, 32), "<f4", 37, 11, 1000, 1 / 64, -7.8125)
    yield "f4_50x32", a, describe(a, g), True
    a, g = gen((224, 224, 3), "|u1", 7, 3, 256)
    yield "u1_224x224x3", a, describe(a, g), True
    a = np.array([[True, False, True], [False, False, True]])
    yield "b1_2x3", a, describe(a), True
    a = np.array([0, -1, 2**62, -(2**62) - 5, 2**53 + 1], dtype=np.int64)
    yield "i8_5", a, describe(a), True
    # arithmetic yields native order, so cast to big-endian last
    a = (np.arange(6, dtype=np.float32).reshape(2, 3) * np.float32(1.25) - np.float32(2)).astype(">f4")
    yield "f4be_2x3", a, describe(a), True
    a = np.array(3.25, dtype=np.float64)
    yield "f8_0d", a, describe(a), True
    a = np.zeros((0, 3), dtype=np.float32)
    yield "f4_0x3", a, describe(a), True
    a = np.array([0.0, 1.0, -1.5, 65504, 2.0**-24, 0.333251953125, float("inf"), float("nan")], dtype=np.float16)
    yield "f2_8", a, describe(a), True
    # a transposed (non-contiguous) array: tobytes() writes it in C order of the transposed shape
    a = np.arange(12, dtype=np.int16).reshape(3, 4).T
    yield "i2_transposed_4x3", a, describe(a), True
    for code, values in DTYPE_VALUES.items():
        orders = "<>" if code[1] != "1" else "|"
        for order in orders:
            dt = np.dtype(order + code)
            with np.errstate(over="ignore"):
                a = np.array(values, dtype=dt)
            tag = {"<": "le", ">": "be", "|": "na"}[order]
            yield f"dtype_{code}_{tag}", a, describe(a), True

    # OpenPI's DROID example observation (images shrunk to keep the fixture small).
    ext, ge = gen((32, 32, 3), "|u1", 5, 1, 256)
    wrist, gw = gen((32, 32, 3), "|u1", 3, 100, 256)
    joints = np.array([0.1, -0.5, 0.25, -2.0, 0.0, 1.5, 0.75], dtype=np.float32)
    grip = np.array([0.5], dtype=np.float32)
    obs = {
        "observation/exterior_image_1_left": ext,
        "observation/wrist_image_left": wrist,
        "observation/joint_position": joints,
        "observation/gripper_position": grip,
        "prompt": "pick up the bottle",
    }
    expect = {
        "observation/exterior_image_1_left": describe(ext, ge),
        "observation/wrist_image_left": describe(wrist, gw),
        "observation/joint_position": describe(joints),
        "observation/gripper_position": describe(grip),
        "prompt": "pick up the bottle",
    }
    yield "obs_droid", obs, expect, True

    # OpenPI's ALOHA example: CHW images under a nested "images" dict, a state vector, a prompt.
    high, gh = gen((3, 16, 16), "|u1", 11, 0, 256)
    left, gl = gen((3, 16, 16), "|u1", 13, 7, 256)
    state = (np.arange(14, dtype=np.float32) / np.float32(8)) - np.float32(0.5)
    obs = {
        "state": state,
        "images": {"cam_high": high, "cam_left_wrist": left},
        "prompt": "put the bottle in the bin, then close the drawer slowly",
    }
    expect = {
        "state": describe(state),
        "images": {"cam_high": describe(high, gh), "cam_left_wrist": describe(left, gl)},
        "prompt": obs["prompt"],
    }
    yield "obs_aloha", obs, expect, True

    # numpy scalars: item() makes floats float64 (even 2.0), ints the smallest msgpack int.
    for name, s in [
        ("npgeneric_f4_1_5", np.float32(1.5)),
        ("npgeneric_f4_2", np.float32(2.0)),
        ("npgeneric_f2_0_1", np.float16(0.1)),
        ("npgeneric_i8_neg7", np.int64(-7)),
        ("npgeneric_i8_2p40", np.int64(2**40)),
        ("npgeneric_i8_neg2p40", np.int64(-(2**40))),
        ("npgeneric_u1_200", np.uint8(200)),
        ("npgeneric_i4_neg300", np.int32(-300)),
        ("npgeneric_b1", np.bool_(True)),
    ]:
        yield name, s, describe_scalar(s), True

    # np.float64 subclasses Python's float, so msgpack writes it as a plain float64 and never
    # calls pack_array: the decoder sees a number, not an __npgeneric__ map.
    yield "f8_scalar_is_plain_float", np.float64(-1e300), -1e300, True

    # A list holding arrays and scalars, as a reply might.
    a = np.array([1, 2, 3], dtype=np.uint16)
    yield "list_mixed", [a, np.float32(0.5), "x", 7], [describe(a), describe_scalar(np.float32(0.5)), "x", 7], True

    # String keys: decoders must accept them (some OpenPI forks write them); encoders never do.
    a = np.array([1.0, 2.0], dtype=np.float32)
    wire = {"__ndarray__": True, "data": a.tobytes(), "dtype": a.dtype.str, "shape": list(a.shape)}
    yield "string_keys", wire, describe(a), False


def sweep_inputs():
    """float32 bit patterns around every float16 rounding boundary (ties, just below, just above)."""
    out = []
    for sign in (0, 1):
        for exp in range(100, 145):
            for high in (0, 1, 0x155, 0x2AA, 0x3FF):
                for low in (0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF):
                    out.append((sign << 31) | (exp << 23) | (high << 13) | low)
    return np.array(out, dtype=np.uint32)


def float16_vectors():
    """float32 -> float16 rounding (numpy's astype: nearest, ties to even) and float16 -> float32.

    Inputs are formulas both languages can rebuild, so only hashes of numpy's outputs are stored
    (plus the explicit pairs, to make a failure readable).
    """
    n = 1 << 20
    hashed = ((np.arange(n, dtype=np.uint64) * 2654435761) % (1 << 32)).astype(np.uint32)
    sweep = sweep_inputs()
    all_halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)

    def f32_to_f16(bits):
        with np.errstate(over="ignore"):
            return bits.view(np.float32).astype(np.float16).view(np.uint16)

    explicit = np.array([
        0x3F800000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x47800000, 0x33000000, 0x33000001, 0x33800000,
        0x387FC000, 0x387FE000, 0x3DCCCCCD, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
        0x00000001, 0x38800000, 0x38801000, 0x38803000,
    ], dtype=np.uint32)
    le16 = lambda a: a.astype("<u2").tobytes()
    return {
        "explicit": [[int(i), int(o)] for i, o in zip(explicit, f32_to_f16(explicit))],
        "hashed": {"formula": "x_i = (i * 2654435761) mod 2^32, i < n", "n": n,
                   "sha256_f16_le": hashlib.sha256(le16(f32_to_f16(hashed))).hexdigest()},
        "sweep": {"formula": "sign in (0,1), exp in 100..144, high in (0,1,0x155,0x2aa,0x3ff), "
                             "low in (0,1,0xfff,0x1000,0x1001,0x1fff): (sign<<31)|(exp<<23)|(high<<13)|low, nested in that order",
                  "n": int(sweep.size), "sha256_f16_le": hashlib.sha256(le16(f32_to_f16(sweep))).hexdigest()},
        "all_halves": {"sha256_f32_le": hashlib.sha256(all_halves.view(np.float16).astype(np.float32).astype("<f4").tobytes()).hexdigest()},
    }


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.msgpack"):
        old.unlink()
    manifest = []
    for name, obj, expect, reencode in cases():
        data = packb(obj)
        (OUT / f"{name}.msgpack").write_bytes(data)
        manifest.append({"name": name, "file": f"{name}.msgpack", "bytes": len(data), "reencode": reencode, "expect": expect})
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (OUT / "float16.json").write_text(json.dumps(float16_vectors(), indent=1) + "\n")
    print(f"wrote {len(manifest)} cases to {OUT}")


if __name__ == "__main__":
    main()
