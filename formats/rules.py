"""Expand a registry entry's tensor rules against a model config into the exact expected tensor set.

The registry (data) says which tensors a model has as name templates with shapes written as small
arithmetic expressions over config values (`"2*text.linear_num_key_heads*text.linear_key_head_dim"`).
This module lives in the format package because both the reader (closed-set check of an artifact,
using the entry embedded in it) and the compiler (validating a checkpoint) need the same expansion.
Expressions are parsed with `ast` and only + - * // and parentheses over integers are allowed: no eval.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass

_MAX_VALUE = 1 << 40
_MAX_REPEAT = 4096  # layers / blocks per rule; a larger count is a corrupt config, not a model
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


class RuleError(ValueError):
    """A registry rule cannot be evaluated against this config."""


@dataclass(frozen=True)
class ExpectedTensor:
    name: str
    shape: tuple[int, ...]
    tensor_class: str  # quantization class, e.g. "linear", "norm", "embedding"
    part: str  # "text", "mtp" or "vision"
    fuse: str | None  # tensors of one layer with the same fuse tag share an NVFP4 global scale
    layer: int | None


def _lookup(config: dict, scopes: dict[str, str], scope: str, key: str):
    if scope not in scopes:
        raise RuleError(f"unknown scope {scope!r} (entry defines {sorted(scopes)})")
    node = config
    path = [p for p in scopes[scope].split(".") if p] + [key]
    for part in path:
        if not isinstance(node, dict) or part not in node:
            raise RuleError(f"config has no value at {'.'.join(path)!r}")
        node = node[part]
    return node


def evaluate(expr: str | int, config: dict, scopes: dict[str, str], index: int | None = None) -> int:
    """Evaluate one shape/count expression; `i` is the repeat index."""
    if isinstance(expr, bool) or not isinstance(expr, (int, str)):
        raise RuleError(f"expression must be an int or a string, got {expr!r}")
    if isinstance(expr, int):
        return expr
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise RuleError(f"bad expression {expr!r}: {e.msg}") from None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and node.id == "i" and index is not None:
            return index
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            value = _lookup(config, scopes, node.value.id, node.attr)
            if type(value) is not int:
                raise RuleError(f"{node.value.id}.{node.attr} is {value!r}, not an integer")
            return value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.FloorDiv) and right == 0:
                raise RuleError(f"division by zero in {expr!r}")
            result = _BINOPS[type(node.op)](left, right)
            if abs(result) > _MAX_VALUE:
                raise RuleError(f"{expr!r} evaluates out of range")
            return result
        raise RuleError(f"unsupported syntax in expression {expr!r}")

    return ev(tree)


def layer_type(entry: dict, index: int) -> str:
    """Layer i's type from the family's repeating pattern (e.g. 3 x linear_attention, full_attention)."""
    pattern = entry.get("layer_pattern")
    if not isinstance(pattern, list) or not pattern or not all(isinstance(p, str) for p in pattern):
        raise RuleError("registry entry has no valid layer_pattern")
    return pattern[index % len(pattern)]


def expand(entry: dict, config: dict, parts: tuple[str, ...] | list[str]) -> dict[str, ExpectedTensor]:
    """All tensors the model must have for the given parts, keyed by name, in rule order."""
    scopes = entry.get("scopes")
    rules = entry.get("tensors")
    if not isinstance(scopes, dict) or not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise RuleError("registry entry lacks valid 'scopes' and 'tensors'")
    out: dict[str, ExpectedTensor] = {}
    for rule in rules:
        if rule["part"] not in parts:
            continue
        if "when" in rule and not _condition(rule["when"], config, scopes):
            continue
        repeat = rule.get("repeat")
        count = None if repeat is None else evaluate(repeat, config, scopes)
        if count is not None and not 0 <= count <= _MAX_REPEAT:
            raise RuleError(f"{rule['name']}: repeat count {count} is out of range [0, {_MAX_REPEAT}]")
        indices = [None] if count is None else range(count)
        for i in indices:
            if i is not None and "layer_type" in rule and layer_type(entry, i) != rule["layer_type"]:
                continue
            name = rule["name"] if i is None else rule["name"].replace("{i}", str(i))
            shape = tuple(evaluate(d, config, scopes, i) for d in rule["shape"])
            if any(d <= 0 for d in shape):
                raise RuleError(f"{name}: shape {shape} has a non-positive dimension")
            if name in out:
                raise RuleError(f"registry rules produce {name!r} twice")
            out[name] = ExpectedTensor(name, shape, rule["class"], rule["part"], rule.get("fuse"), i)
    return out


def _condition(cond: dict, config: dict, scopes: dict[str, str]) -> bool:
    """`when = {key = "text.tie_word_embeddings", equals = false}`: include the rule only then."""
    scope, _, key = cond["key"].partition(".")
    try:
        value = _lookup(config, scopes, scope, key)
    except RuleError:
        value = cond.get("default")
    return value == cond["equals"]
