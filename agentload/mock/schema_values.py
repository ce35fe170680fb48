"""A JSON value for a JSON schema: the arguments of the mock's tool calls.

Covers the subset tool definitions use (object, array, string, number, integer, boolean, null,
const, enum, anyOf/oneOf/allOf by their first option, bounds and lengths); anything else, or a
schema nested too deep, gets a few words. Drawn from the request's own seeded stream, so a
request's answer is the same every time it is sent.
"""

from __future__ import annotations

import math
import random
from typing import Any

from agentload.tokens import _WORDS


def _short_text(rng: random.Random, lo: int = 1, hi: int = 4) -> str:
    return " ".join(rng.choices(_WORDS, k=rng.randint(lo, hi)))


def gen_value(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A JSON value valid against a (simple) JSON schema: the subset tool definitions use."""
    if not isinstance(schema, dict) or depth > 32:
        return _short_text(rng)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return rng.choice(enum)
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "null")
    if t is None:
        if "properties" in schema:
            t = "object"
        elif "items" in schema:
            t = "array"
        else:
            for key in ("anyOf", "oneOf", "allOf"):
                options = schema.get(key)
                if isinstance(options, list) and options:
                    return gen_value(options[0], rng, depth + 1)
            t = "string"
    if t == "object":
        return _object(schema, rng, depth)
    if t == "array":
        return _array(schema, rng, depth)
    if t in ("integer", "number"):
        return _number(schema, rng, t == "integer")
    if t == "boolean":
        return rng.random() < 0.5
    if t == "null":
        return None
    return _string(schema, rng)


def _object(schema: dict[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
    """Every required property, and each optional one with even odds."""
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    required = schema.get("required")
    required = required if isinstance(required, list) else []
    out: dict[str, Any] = {}
    for name, sub in props.items():
        if name in required or rng.random() < 0.5:
            out[name] = gen_value(sub, rng, depth + 1)
    for name in required:
        if name not in out:
            out[name] = _short_text(rng)
    return out


def _array(schema: dict[str, Any], rng: random.Random, depth: int) -> list[Any]:
    lo = schema.get("minItems", 1)
    lo = lo if isinstance(lo, int) and lo >= 0 else 1
    hi = schema.get("maxItems", lo + 2)
    hi = hi if isinstance(hi, int) and hi >= lo else lo + 2
    n = lo if depth >= 4 else rng.randint(lo, min(hi, lo + 3))  # deep down: as few as allowed
    return [gen_value(schema.get("items"), rng, depth + 1) for _ in range(n)]


def _number(schema: dict[str, Any], rng: random.Random, integer: bool) -> int | float:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if not isinstance(lo, (int, float)):
        ex = schema.get("exclusiveMinimum")
        lo = ex + 1 if isinstance(ex, (int, float)) and not isinstance(ex, bool) else 0
    if not isinstance(hi, (int, float)):
        ex = schema.get("exclusiveMaximum")
        hi = ex - 1 if isinstance(ex, (int, float)) and not isinstance(ex, bool) else lo + 100
    if hi < lo:
        hi = lo
    if integer:
        ilo, ihi = math.ceil(lo), math.floor(hi)
        return rng.randint(ilo, max(ilo, ihi))
    return round(rng.uniform(lo, hi), 3)


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    text = _short_text(rng)
    min_len, max_len = schema.get("minLength"), schema.get("maxLength")
    if isinstance(min_len, int) and len(text) < min_len:
        text = text + "x" * (min_len - len(text))
    if isinstance(max_len, int) and len(text) > max_len:
        text = text[:max_len]
    return text
