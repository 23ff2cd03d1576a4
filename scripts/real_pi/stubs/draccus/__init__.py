"""Minimal stand-in for draccus (not in the local package index): only what LeRobot's config
classes use at import and what make_lerobot_e2e.py needs to encode a config (see encode)."""
from .choice_types import ChoiceRegistry  # noqa: F401
import dataclasses, enum, pathlib


def field(*a, **k):
    return dataclasses.field(*a, **k)


def encode(obj, declared_type=None):
    """draccus.encode for the values LeRobot's policy configs hold: dataclasses -> dict (a
    ChoiceRegistry subclass encoded against its base gets its choice name as `type` first),
    enums -> value, Path -> str, tuple -> list."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        if declared_type is not None and isinstance(obj, ChoiceRegistry) and type(obj) is not declared_type:
            out['type'] = type(obj).get_choice_name(type(obj))
        for f in dataclasses.fields(obj):
            if not f.init:
                continue
            out[f.name] = encode(getattr(obj, f.name), f.type if isinstance(f.type, type) and issubclass(f.type, ChoiceRegistry) else None)
        return out
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, pathlib.PurePath):
        return str(obj)
    if isinstance(obj, dict):
        return {str(encode(k)): encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    return obj
