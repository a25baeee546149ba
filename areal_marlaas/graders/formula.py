"""The multi grader's ``calculate_output`` formula: parsed, never ``eval``-ed.

Grammar (a small recursive-descent parser; ``^`` is power, right-associative,
binding tighter than unary minus, so ``-a^2`` is ``-(a^2)`` and ``2^3^2`` is 512)::

    expr  := term (("+" | "-") term)*
    term  := unary (("*" | "/") unary)*
    unary := ("-" | "+") unary | power
    power := atom ("^" unary)?
    atom  := NUMBER | KEY | FUNC "(" expr ("," expr)* ")" | "(" expr ")"

KEY is a sub-grader key; FUNC is one of ``min max`` (two or more arguments) or
``abs floor ceil exp sqrt log`` (one; ``log`` is the natural log). Everything is
computed in floats, so a huge power overflows instead of building a huge integer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from areal_marlaas.graders.errors import GraderError

MAX_LENGTH = 4096
MAX_DEPTH = 64
UNARY_FUNCS = {
    "abs": abs,
    "floor": math.floor,
    "ceil": math.ceil,
    "exp": math.exp,
    "sqrt": math.sqrt,
    "log": math.log,
}
VARIADIC_FUNCS = {"min": min, "max": max}
FUNCS = set(UNARY_FUNCS) | set(VARIADIC_FUNCS)

_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<op>[-+*/^(),]))"
)


class FormulaError(Exception):
    """The formula could not be evaluated (division by zero, domain error...)."""


# Node shapes: ("num", x) ("var", key) ("neg", n) ("bin", op, a, b)
# ("call", name, [args]).
Node = tuple


@dataclass(frozen=True)
class Formula:
    source: str
    tree: Node

    @property
    def variables(self) -> set[str]:
        out: set[str] = set()
        _collect(self.tree, out)
        return out

    def evaluate(self, values: dict[str, float]) -> float:
        try:
            result = float(_eval(self.tree, values))
        except ZeroDivisionError:
            raise FormulaError("calculate_output: division by zero") from None
        except (ValueError, OverflowError) as e:
            raise FormulaError(f"calculate_output: {e}") from None
        if not math.isfinite(result):
            raise FormulaError(f"calculate_output: result is {result}")
        return result


def _collect(node: Node, out: set[str]) -> None:
    kind = node[0]
    if kind == "var":
        out.add(node[1])
    elif kind == "neg":
        _collect(node[1], out)
    elif kind == "bin":
        _collect(node[2], out)
        _collect(node[3], out)
    elif kind == "call":
        for arg in node[2]:
            _collect(arg, out)


def _eval(node: Node, values: dict[str, float]) -> float:
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "var":
        return float(values[node[1]])
    if kind == "neg":
        return -_eval(node[1], values)
    if kind == "bin":
        a, b = _eval(node[2], values), _eval(node[3], values)
        op = node[1]
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return a / b
        return math.pow(a, b)
    name, args = node[1], [_eval(a, values) for a in node[2]]
    if name in VARIADIC_FUNCS:
        return VARIADIC_FUNCS[name](args)
    return float(UNARY_FUNCS[name](args[0]))


class _Parser:
    def __init__(self, text: str, keys: set[str], param: str):
        self.text, self.keys, self.param = text, keys, param
        self.tokens = self._tokenize()
        self.i = 0
        self.depth = 0

    def fail(self, why: str) -> GraderError:
        return GraderError(
            f"{self.param}: cannot parse formula {self.text!r}: {why}", self.param
        )

    def _tokenize(self) -> list[tuple[str, str, int]]:
        tokens, pos = [], 0
        while pos < len(self.text):
            if self.text[pos:].strip() == "":
                break
            m = _TOKEN.match(self.text, pos)
            if m is None:
                col = len(self.text[pos:]) - len(self.text[pos:].lstrip()) + pos
                raise self.fail(
                    f"unexpected {self.text[col]!r} at position {col}; allowed: "
                    "numbers, sub-grader keys, + - * / ^ ( ) , and "
                    + " ".join(sorted(FUNCS))
                )
            kind = m.lastgroup
            assert kind is not None  # every alternative of _TOKEN is named
            tokens.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        return tokens

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, op: str | None = None) -> tuple[str, str, int]:
        tok = self.peek()
        if tok is None:
            raise self.fail(
                f"expected {op!r} but the formula ended"
                if op
                else "unexpected end of formula"
            )
        if op is not None and tok[1] != op:
            raise self.fail(f"expected {op!r} at position {tok[2]}, got {tok[1]!r}")
        self.i += 1
        return tok

    def at(self, *ops: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[0] == "op" and tok[1] in ops

    def parse(self) -> Node:
        if not self.tokens:
            raise self.fail("it is empty")
        node = self.expr()
        tok = self.peek()
        if tok is not None:
            raise self.fail(f"unexpected {tok[1]!r} at position {tok[2]}")
        return node

    def nest(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH} levels")

    def expr(self) -> Node:
        node = self.term()
        while self.at("+", "-"):
            op = self.take()[1]
            node = ("bin", op, node, self.term())
        return node

    def term(self) -> Node:
        node = self.unary()
        while self.at("*", "/"):
            op = self.take()[1]
            node = ("bin", op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.at("-", "+"):
            op = self.take()[1]
            self.nest()
            inner = self.unary()
            self.depth -= 1
            return ("neg", inner) if op == "-" else inner
        return self.power()

    def power(self) -> Node:
        base = self.atom()
        if self.at("^"):
            self.take()
            self.nest()
            exponent = self.unary()
            self.depth -= 1
            return ("bin", "^", base, exponent)
        return base

    def atom(self) -> Node:
        tok = self.take()
        kind, text, pos = tok
        if kind == "num":
            return ("num", float(text))
        if kind == "name":
            if self.at("("):
                return self.call(text, pos)
            if text in FUNCS:
                raise self.fail(f"{text!r} is a function: call it as {text}(...)")
            if text not in self.keys:
                known = ", ".join(sorted(self.keys)) or "none"
                raise self.fail(
                    f"unknown name {text!r} at position {pos}; the sub-grader keys "
                    f"are: {known}"
                )
            return ("var", text)
        if text == "(":
            self.nest()
            node = self.expr()
            self.depth -= 1
            self.take(")")
            return node
        raise self.fail(f"unexpected {text!r} at position {pos}")

    def call(self, name: str, pos: int) -> Node:
        if name not in FUNCS:
            raise self.fail(
                f"unknown function {name!r} at position {pos}; allowed: "
                + ", ".join(sorted(FUNCS))
            )
        self.take("(")
        self.nest()
        args = [self.expr()]
        while self.at(","):
            self.take()
            args.append(self.expr())
        self.take(")")
        self.depth -= 1
        if name in UNARY_FUNCS and len(args) != 1:
            raise self.fail(f"{name}() takes 1 argument, got {len(args)}")
        if name in VARIADIC_FUNCS and len(args) < 2:
            raise self.fail(f"{name}() takes 2 or more arguments, got {len(args)}")
        return ("call", name, args)


def parse_formula(text: object, keys: set[str], param: str) -> Formula:
    """Parse ``text`` over the sub-grader ``keys``; GraderError naming ``param``."""
    if not isinstance(text, str):
        raise GraderError(
            f"{param} must be a string formula, got {type(text).__name__}", param
        )
    if len(text) > MAX_LENGTH:
        raise GraderError(
            f"{param}: formula is {len(text)} characters; the limit is {MAX_LENGTH}",
            param,
        )
    return Formula(text, _Parser(text, keys, param).parse())
