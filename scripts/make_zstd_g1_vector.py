"""Makes test/vectors/zstd/g1-obs96.dict.zst from g1-obs96.msgpack with Python's zstandard.

g1-obs96.msgpack is an OpenPI observation (msgpack-numpy) of a real G1 frame (episode 0, frame 0
of shared/datasets/g1_pick_bottle, resized with padding to 96x96) plus a 26-float state and a
prompt, as bench/codecs.ts builds it. The frame is compressed the way an OpenPI client would:
level 1 with protocol/observation.zdict, content size written.

    python3 scripts/make_zstd_g1_vector.py
"""
import pathlib

import zstandard

root = pathlib.Path(__file__).resolve().parent.parent
vec = root / "test" / "vectors" / "zstd"
plain = (vec / "g1-obs96.msgpack").read_bytes()
d = zstandard.ZstdCompressionDict((root / "protocol" / "observation.zdict").read_bytes())
z = zstandard.ZstdCompressor(level=1, dict_data=d, write_content_size=True).compress(plain)
assert zstandard.ZstdDecompressor(dict_data=d).decompress(z) == plain
(vec / "g1-obs96.dict.zst").write_bytes(z)
print(f"g1-obs96.dict.zst: {len(plain)} -> {len(z)} bytes")
