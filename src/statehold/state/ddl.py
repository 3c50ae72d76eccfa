"""Spark DDL type strings parsed in pure Python, into PySpark's own `DataType` objects.

Why not Spark's parser: a schema given as DDL text is parsed where the code naming it runs,
and that is a Spark task, a Python worker with no JVM to ask (`_parse_datatype_string`
needs a SparkContext). A processor's ``init`` declares its variables in every task, and a
`run_batch` function's ``state.value(name, schema=...)`` runs only in tasks, so nothing
parsed on the driver could stand in for it. The driver's own parse of a processor's
declarations (`statehold.processor.record`) uses this parser too, so the schema a
checkpoint records is exactly the one the tasks encode with. Where a JVM is at hand and
nothing must match the tasks, Spark parses (the state reader's output schema,
`statehold.spark.reader`).

It is a small recursive-descent parser for the part of Spark's grammar that state schemas
use, accepting what Spark accepts in the order Spark tries it: a column list
(``a INT, b STRING NOT NULL``, ``a: INT``), else one data type (``BIGINT``,
``STRUCT<a: INT>``). A test parses the same strings with Spark's parser and compares the
results.
"""

from __future__ import annotations

import re
from typing import NoReturn

from pyspark.sql.types import (
    ArrayType,
    CharType,
    DataType,
    DayTimeIntervalType,
    DecimalType,
    MapType,
    StringType,
    StructField,
    StructType,
    VarcharType,
    YearMonthIntervalType,
)

from statehold.errors import InvalidArgumentError
from statehold.state.types import BY_DDL

#: How deeply types may nest (far beyond a real schema, far below Python's stack).
MAX_NESTING = 64
_MAX_DECIMAL_PRECISION = 38

_TOKEN = re.compile(
    r"\s*(?:(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<quoted>`(?:[^`]|``)*`)|(?P<number>\d+)"
    r"|(?P<string>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")|(?P<punct>[<>(),:]))"
)

_DAY_TIME = {"DAY": 0, "HOUR": 1, "MINUTE": 2, "SECOND": 3}
_YEAR_MONTH = {"YEAR": 0, "MONTH": 1}


class DDLError(InvalidArgumentError):
    """A schema string Spark's DDL grammar (as far as state schemas use it) rejects."""

    def __init__(self, message: str, position: int = 0) -> None:
        super().__init__(message)
        self.position = position


class _Tokens:
    def __init__(self, text: str) -> None:
        self.text = text
        self.items: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise DDLError(f"cannot parse schema {text!r} at position {pos}")
            kind = m.lastgroup or ""
            self.items.append((kind, m.group(kind)))
            pos = m.end()
        self.pos = 0

    def peek(self, offset: int = 0) -> tuple[str, str] | None:
        i = self.pos + offset
        return self.items[i] if i < len(self.items) else None

    def keyword(self, *words: str) -> str | None:
        """Consume the next token if it is one of `words` (case-insensitive)."""
        tok = self.peek()
        if tok and tok[0] == "ident" and tok[1].upper() in words:
            self.pos += 1
            return tok[1].upper()
        return None

    def punct(self, char: str) -> bool:
        if self.peek() == ("punct", char):
            self.pos += 1
            return True
        return False

    def expect(self, char: str) -> None:
        if not self.punct(char):
            self.fail(f"expected {char!r}")

    def number(self) -> int:
        tok = self.peek()
        if not tok or tok[0] != "number":
            self.fail("expected a number")
        self.pos += 1
        return int(tok[1])

    def name(self) -> str:
        tok = self.peek()
        if tok and tok[0] == "ident":
            self.pos += 1
            return tok[1]
        if tok and tok[0] == "quoted":
            self.pos += 1
            return tok[1][1:-1].replace("``", "`")
        self.fail("expected a field name")

    def at_end(self) -> bool:
        return self.pos >= len(self.items)

    def fail(self, why: str) -> NoReturn:
        tok = self.peek()
        where = f"at {tok[1]!r}" if tok else "at the end"
        raise DDLError(f"cannot parse schema {self.text!r}: {why} {where}", self.pos)


def parse_ddl(text: str) -> DataType:
    """The `DataType` of a Spark DDL string, tried as Spark tries it: a column list, else a
    data type, else the fields of a struct."""
    if not isinstance(text, str) or not text.strip():
        raise DDLError(f"a schema string must be non-empty text, not {text!r}")
    errors: list[DDLError] = []
    for attempt in (_column_list, _single_type):
        try:
            return attempt(_Tokens(text))
        except DDLError as e:
            errors.append(e)
    raise max(errors, key=lambda e: e.position)  # the attempt that got furthest


def _column_list(t: _Tokens) -> DataType:
    fields = [_field(t, 0)]
    while t.punct(","):
        fields.append(_field(t, 0))
    if not t.at_end():
        t.fail("unexpected text")
    return StructType(fields)


def _single_type(t: _Tokens) -> DataType:
    dtype = _type(t, 0)
    if not t.at_end():
        t.fail("unexpected text")
    return dtype


def _field(t: _Tokens, depth: int) -> StructField:
    name = t.name()
    t.punct(":")
    dtype = _type(t, depth + 1)
    nullable = True
    metadata: dict[str, str] = {}
    while True:
        if t.keyword("NOT"):
            if not t.keyword("NULL"):
                t.fail("expected NULL after NOT")
            nullable = False
        elif t.keyword("COMMENT"):
            tok = t.peek()
            if not tok or tok[0] != "string":
                t.fail("expected a quoted comment")
            t.pos += 1
            metadata["comment"] = _unquote(tok[1])
        else:
            break
    return StructField(name, dtype, nullable, metadata)


def _type(t: _Tokens, depth: int) -> DataType:
    if depth > MAX_NESTING:
        t.fail(f"types nest more than {MAX_NESTING} deep")
    word = t.keyword(*BY_DDL, "ARRAY", "MAP", "STRUCT", "INTERVAL")
    if word is None:
        t.fail("expected a data type")
    kind = BY_DDL.get(word)
    if kind is StringType:
        return StringType(t.name()) if t.keyword("COLLATE") else StringType()
    if kind is CharType or kind is VarcharType:
        t.expect("(")
        length = t.number()
        t.expect(")")
        return VarcharType(length) if kind is VarcharType else CharType(length)
    if kind is DecimalType:
        precision, scale = 10, 0
        if t.punct("("):
            precision = t.number()
            if t.punct(","):
                scale = t.number()
            t.expect(")")
        if not 1 <= precision <= _MAX_DECIMAL_PRECISION or scale > precision:
            t.fail(f"invalid DECIMAL({precision},{scale})")
        return DecimalType(precision, scale)
    if kind is not None:
        return kind()
    if word == "ARRAY":
        t.expect("<")
        element = _type(t, depth + 1)
        t.expect(">")
        return ArrayType(element, True)
    if word == "MAP":
        t.expect("<")
        key = _type(t, depth + 1)
        t.expect(",")
        value = _type(t, depth + 1)
        t.expect(">")
        return MapType(key, value, True)
    if word == "STRUCT":
        t.expect("<")
        fields: list[StructField] = []
        if not t.punct(">"):
            fields.append(_field(t, depth))
            while t.punct(","):
                fields.append(_field(t, depth))
            t.expect(">")
        return StructType(fields)
    return _interval(t)


def _interval(t: _Tokens) -> DataType:
    start = t.keyword(*_DAY_TIME, *_YEAR_MONTH)
    if start is None:
        t.fail("expected an interval unit")
    units = _DAY_TIME if start in _DAY_TIME else _YEAR_MONTH
    end = start
    if t.keyword("TO"):
        end = t.keyword(*units) or t.fail("expected an interval unit after TO")
    if units[end] < units[start]:
        t.fail(f"INTERVAL {start} TO {end} is not a valid interval")
    if units is _DAY_TIME:
        return DayTimeIntervalType(units[start], units[end])
    return YearMonthIntervalType(units[start], units[end])


def _unquote(quoted: str) -> str:
    return re.sub(r"\\(.)", r"\1", quoted[1:-1])
