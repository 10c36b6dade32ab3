"""Parse Prometheus text 0.0.4 and OpenMetrics 1.0 exactly and fast: `parse(data) -> ParseResult`.

Names and values arrive exactly as exposed, unlike `prometheus_client.parser`: counters keep their
names (no `_total` added), untyped series are not split into families, exemplars never become
timestamps, `vllm:` colons stay. Every invalid line becomes a `ParseIssue` with its line number and the
rest of the input is still parsed.

Speed: one compiled regex over the whole text takes apart ordinary sample lines; label sets are split on
commas and each `name="value"` piece is validated once and cached (a `Parser` keeps its caches across
calls, so a scraper reuses one per target). Anything unusual (escapes, quoted names, odd spacing,
exemplars in text) goes to the careful scanner in `gpuwatch.promtext.scanner`, which also words the errors.

What counts as an error (the line is dropped, nothing else): bad UTF-8; a malformed line; invalid
metric or label names; a duplicate label name or a `__name__` label; a value or timestamp that does not
parse (Go's ParseFloat spellings such as `Inf`, `nan`, `+Infinity` are fine, `0x1p3`, `1_0`, `1e999` are
not); a histogram bucket without a float `le` or a summary quantile without a float `quantile`; a second
TYPE for a name, a TYPE after that family's samples, an unknown type. OpenMetrics adds: blank lines,
plain comments, CR line endings, trailing commas, metadata after samples or repeated, a UNIT that is not
the name's suffix, anything after `# EOF`, and a missing `# EOF`. A UTF-8 byte-order mark at the very
start is skipped. Exemplars (OpenMetrics only) are dropped unless `keep_exemplars`.

What a parse gives is in `result.py`; the formats' content types, and telling them apart, in `formats.py`.
"""

from __future__ import annotations

import itertools
import re

from gpuwatch.core.model import Labels
from gpuwatch.promtext.formats import looks_like_openmetrics
from gpuwatch.promtext.result import Exemplar, FamilyMeta, ParsedSample, ParseIssue, ParseResult
from gpuwatch.promtext.scanner import (
    FLOAT,
    FLOAT_RE,
    LABEL_NAME,
    METRIC_NAME,
    LineError,
    Metadata,
    decode_lines,
    label_entry,
    parse_float,
    scan_comment,
    scan_sample,
    timestamp_ms,
)

MAX_LINE_TEXT = 200
_MAX_VALUES = 1024  # value texts remembered by a Parser (text format)

_TEXT_SAMPLE = (
    rf"({METRIC_NAME})(?:[ \t]*\{{([^}}\n]*)\}}[ \t]*|[ \t]+)({FLOAT})(?:[ \t]+([-+]?\d+))?[ \t]*\r?()"
)
_OM_SAMPLE = rf"({METRIC_NAME})(?:\{{([^}}\n]*)\}})? ({FLOAT})(?: ({FLOAT}))?(?: (# \{{[^\n]*))?"
# One match per line: either a plain sample (groups 1-5) or anything else (group 6).
_TEXT_DOC = re.compile(rf"^(?:{_TEXT_SAMPLE}|(.*))$", re.M)
_OM_DOC = re.compile(rf"^(?:{_OM_SAMPLE}|(.*))$", re.M)
_TEXT_PAIR = re.compile(rf'[ \t]*({LABEL_NAME})[ \t]*=[ \t]*"([^"\\]*)"[ \t]*')
_OM_PAIR = re.compile(rf'({LABEL_NAME})="([^"\\]*)"')
_KEEP_PAIRS = 4096  # label pieces kept when the piece cache is cleared (the oldest)
_SUFFIXES = ("", "_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info")


class Parser:
    """A reusable parser; its label-set caches survive between calls (use one per scrape target)."""

    def __init__(self, *, keep_exemplars: bool = False, max_cache: int = 200_000) -> None:
        self.keep_exemplars = keep_exemplars
        # Each cache is cleared past this many entries: `max_cache`, or twice the last page's lines
        # where that is more, so that a page of more lines than `max_cache` is still found in the
        # caches at the next scrape (cleared at every one, it would cost ~7x the CPU a line).
        self.base_cache = max_cache
        self.max_cache = max_cache
        # per format: label-set text -> (labels, le state, quantile state); `name="value"` -> pair
        self._bodies: dict[bool, dict[str, tuple[Labels, int, int]]] = {False: {}, True: {}}
        self._pairs: dict[bool, dict[str, tuple[str, str]]] = {False: {}, True: {}}
        # text format: a line's text up to the space before its value -> (name, labels, le, quantile),
        # for lines that held only a series and a value; and value text -> float for valid values
        self._series: dict[str, tuple[str, Labels, int, int]] = {}
        self._comments: dict[bool, dict[str, Metadata]] = {False: {}, True: {}}  # comment line -> parsed
        self._values: dict[str, float] = {}
        self._names: set[str] = set()  # label names that a pattern took (valid in both formats)
        # text format: the metric names that the full pattern took, each to one string object of it
        self._metric_names: dict[str, str] = {}

    def _labels(self, body: str, om: bool) -> tuple[Labels, int, int] | None:
        """Fast label-set parse of `a="x",b="y"` (no escapes); None sends the line to the careful scanner."""
        if "\\" in body:
            return None
        pieces = body.split(",")
        if len(pieces) > 1 and not pieces[-1].strip(" \t"):
            if om:
                return None
            pieces.pop()
        cache, names = self._pairs[om], self._names
        if len(cache) > self.max_cache:
            # Keep the oldest pieces: those a page repeats on many lines (`job="x"`, a histogram's
            # `le`) are met first, and the same pair objects keep equal label sets identical, which
            # later dict lookups compare by identity (a million new series: ~1,700 instructions each).
            keep = dict(itertools.islice(cache.items(), min(_KEEP_PAIRS, self.max_cache // 2)))
            cache.clear()
            cache.update(keep)
            names.clear()
            names.update(name for name, _ in keep.values())
        pattern = _OM_PAIR if om else _TEXT_PAIR
        pairs = []
        for piece in pieces:
            pair = cache.get(piece)
            if pair is None:
                # `name="value"` as both formats write it, else the pattern (blanks, bad names)
                name, _, quoted = piece.partition('="')
                value = quoted[:-1]
                if name in names and quoted[-1:] == '"' and '"' not in value:
                    pair = cache[piece] = (name, value)
                else:
                    m = pattern.fullmatch(piece)
                    if m is None:
                        return None
                    pair = cache[piece] = (m.group(1), m.group(2))
                    names.add(pair[0])
            pairs.append(pair)
        found = dict(pairs)
        if len(found) != len(pairs) or "__name__" in found:
            return None  # (the careful scanner words the error)
        le, quantile = found.get("le"), found.get("quantile")
        return (
            tuple(sorted(pairs)),
            0 if le is None else 1 if FLOAT_RE.fullmatch(le) else 2,
            0 if quantile is None else 1 if FLOAT_RE.fullmatch(quantile) else 2,
        )

    def parse(
        self,
        data: bytes | str,
        *,
        openmetrics: bool | None = None,
        default_timestamp_ms: int | None = None,
    ) -> ParseResult:
        """Parse one exposition; `openmetrics=None` guesses the format from a final `# EOF`."""
        bad_lines: list[int] = []
        if isinstance(data, str):
            text = data
        else:
            text, bad_lines = decode_lines(bytes(data))
        if text.startswith("\ufeff"):
            text = text[1:]
        om = looks_like_openmetrics(text) if openmetrics is None else bool(openmetrics)
        state = _State(self, om, default_timestamp_ms, text, bad_lines)
        state.run()
        self.max_cache = max(self.base_cache, 2 * state.line_count)
        return ParseResult(
            state.samples,
            {k: FamilyMeta(k, *v) for k, v in state.meta.items()},
            state.errors,
            om,
            state.line_count,
            state.exemplars,
            state.keys,
        )


def parse(
    data: bytes | str,
    *,
    openmetrics: bool | None = None,
    default_timestamp_ms: int | None = None,
    keep_exemplars: bool = False,
) -> ParseResult:
    """Parse Prometheus text 0.0.4 or OpenMetrics (guessed from `# EOF` unless `openmetrics` is given)."""
    return Parser(keep_exemplars=keep_exemplars).parse(
        data, openmetrics=openmetrics, default_timestamp_ms=default_timestamp_ms
    )


class _State:
    """One parse in progress."""

    def __init__(self, parser: Parser, om: bool, default_ts: int | None, text: str, bad: list[int]) -> None:
        self.parser = parser
        self.om = om
        self.default_ts = default_ts
        self.text = text
        self.bad = set(bad)
        self._lines: list[str] | None = None
        self.samples: list[ParsedSample] = []
        self.errors: list[ParseIssue] = []
        self.exemplars: list[Exemplar] = []
        self.keys: list[str | None] = []
        self.meta: dict[str, list[str]] = {}  # family -> [type, help, unit]
        self.declared: set[tuple[str, str]] = set()  # (kind, family) seen, for duplicates
        self.seen: set[str] = set()  # sample names so far
        self.checks: dict[str, str] = {}  # sample name -> "le" | "quantile"
        self.line_count = 0
        self.eof_line = 0
        self.at_eof = (0, 0)

    def line(self, line_no: int) -> str:
        if self._lines is None:
            self._lines = self.text.split("\n")
        return self._lines[line_no - 1]

    def error(self, line_no: int, message: str, line: str | None = None) -> None:
        text = self.line(line_no) if line is None else line
        if len(text) > MAX_LINE_TEXT:
            text = text[:MAX_LINE_TEXT] + "..."
        self.errors.append(ParseIssue(line_no, message, text))

    def run(self) -> None:
        if not self.om:
            self.run_text()
            return
        om = self.om
        rows = (_OM_DOC if om else _TEXT_DOC).findall(self.text)
        if self.text.endswith("\n") or not self.text:
            rows.pop()  # the empty "line" after the final newline
        self.line_count = len(rows)
        bodies = self.parser._bodies[om]
        if len(bodies) > self.parser.max_cache:
            bodies.clear()
        labels_for = self.parser._labels
        append = self.samples.append
        seen_add = self.seen.add
        checks = self.checks
        default_ts = self.default_ts
        line_no = 0
        for name, body, value, ts, exemplar, other in rows:
            line_no += 1
            if not name:
                self.other(line_no, other)
                continue
            if body:
                entry = bodies.get(body)
                if entry is None:
                    entry = labels_for(body, om)
                    if entry is None:
                        self.careful(line_no, self.line(line_no))
                        continue
                    bodies[body] = entry
                labels, le, quantile = entry
            else:
                labels, le, quantile = (), 0, 0
            v = float(value)
            if v - v and v == v and value[-1] not in "fFyY":
                self.error(line_no, f"value out of range: {value!r}")
                continue
            t: int | None = default_ts
            if ts:
                try:
                    t = timestamp_ms(ts, om)
                except LineError as e:
                    self.error(line_no, str(e))
                    continue
            if name in checks and not self.check(line_no, name, le, quantile):
                continue
            if exemplar and not self.exemplar(line_no, exemplar):
                continue
            seen_add(name)
            append((name, labels, t, v))
        if om:
            self.finish_openmetrics()

    def run_text(self) -> None:  # noqa: C901 - the parser's hot loop: one branch per line form, kept inline for speed
        """Text format, line by line: a line seen before as `<series> <value>` costs a dict lookup.

        A line whose text up to its last space is a known series (cached from an earlier line that the
        full pattern took apart, with nothing after the value) and whose last word is a valid value
        is that series with that value: the grammar leaves no other reading. A new line written as
        exporters write it, `name{labels} value` with a metric name the full pattern already took, is
        split at its first brace (a page of new series); anything else goes through the full pattern.
        Label pieces `name="value"` with a label name seen before are split at `="` likewise.
        """
        text = self.text
        lines = text.split("\n")
        if text.endswith("\n") or not text:
            lines.pop()  # the empty "line" after the final newline
        self._lines = lines
        self.line_count = len(lines)
        parser = self.parser
        bodies, series, values = parser._bodies[False], parser._series, parser._values
        names = parser._metric_names
        for cache in (bodies, series, names):
            if len(cache) > parser.max_cache:
                cache.clear()
        names_setdefault = names.setdefault
        if len(values) > _MAX_VALUES:  # counters make new value texts every scrape: keep this one small
            values.clear()
        labels_for = parser._labels
        match = _TEXT_DOC.match
        float_match = FLOAT_RE.fullmatch
        append, key_append = self.samples.append, self.keys.append
        seen_add = self.seen.add
        checks = self.checks
        default_ts = self.default_ts
        bad = self.bad
        line_no = 0
        for line in lines:
            line_no += 1
            key, _, value = line.rpartition(" ")
            entry = series.get(key)
            if entry is not None and not (bad and line_no in bad):
                v = values.get(value)
                if v is None and float_match(value) is not None:
                    v = float(value)
                    if v - v and v == v and value[-1] not in "fFyY":
                        v = None  # out of range: the full pattern reports it
                    else:
                        values[value] = v
                if v is not None:
                    name, labels, le, quantile = entry
                    need = checks.get(name)
                    if need is not None and (le != 1 if need == "le" else quantile == 2):
                        self.check(line_no, name, le, quantile)  # reports it
                        continue
                    seen_add(name)
                    append((name, labels, default_ts, v))
                    key_append(key)
                    continue
            # `name{labels} value` as exporters write it, split where the full pattern would split it
            split, _, body = key.partition("{")
            known = names.get(split)
            if (
                known is not None
                and body[-1:] == "}"
                and "}" not in (body := body[:-1])
                and float_match(value) is not None
                and not (bad and line_no in bad)
            ):
                name, value_text, ts = known, value, None
            else:
                m = match(line)
                assert m is not None  # the pattern's second branch takes any line
                name, body, value_text, ts, _, other = m.groups()
                if not name:
                    self.other(line_no, other)
                    continue
                name = names_setdefault(name, name)  # (one string object per name, not per series)
            if body:
                found = bodies.get(body)
                if found is None:
                    found = labels_for(body, False)
                    if found is None:
                        self.careful(line_no, line)
                        continue
                    bodies[body] = found
                labels, le, quantile = found
            else:
                labels, le, quantile = (), 0, 0
            v = float(value_text)
            if v - v and v == v and value_text[-1] not in "fFyY":
                self.error(line_no, f"value out of range: {value_text!r}")
                continue
            t: int | None = default_ts
            if ts:
                try:
                    t = timestamp_ms(ts, False)
                except LineError as e:
                    self.error(line_no, str(e))
                    continue
            if name in checks and not self.check(line_no, name, le, quantile):
                continue
            seen_add(name)
            append((name, labels, t, v))
            if not ts and value == value_text and not (bad and line_no in bad):
                series[key] = (name, labels, le, quantile)
                key_append(key)
            else:
                key_append(None)

    def finish_openmetrics(self) -> None:
        """Require `# EOF` as the last line; whatever follows it is reported and dropped."""
        if not self.eof_line:
            self.errors.append(
                ParseIssue(max(self.line_count, 1), "missing '# EOF' at the end of the OpenMetrics text", "")
            )
            return
        if self.eof_line == self.line_count:
            return
        samples_at_eof, exemplars_at_eof = self.at_eof
        del self.samples[samples_at_eof:]
        del self.exemplars[exemplars_at_eof:]
        self.errors = [e for e in self.errors if e.line_no < self.eof_line]
        for n in range(self.eof_line + 1, self.line_count + 1):
            self.error(n, "text after '# EOF'")

    def check(self, line_no: int, name: str, le: int, quantile: int) -> bool:
        """Histogram buckets need a float `le`, summary quantiles a float `quantile`."""
        if self.checks[name] == "le":
            if le != 1:
                self.error(line_no, "histogram bucket without a float 'le' label")
                return False
        elif quantile == 2:
            self.error(line_no, "summary quantile with a 'quantile' label that is not a float")
            return False
        return True

    def exemplar(self, line_no: int, text: str) -> bool:
        """Validate (and keep, if asked) an OpenMetrics exemplar; False drops the line."""
        try:
            scanned = scan_sample("x 0 " + text, True)
            assert scanned.exemplar is not None
            pairs, value, ts = scanned.exemplar
            labels = label_entry(pairs)[0]
            exemplar = Exemplar(
                len(self.samples), labels, parse_float(value), timestamp_ms(ts, True) if ts else None
            )
        except LineError as e:
            self.error(line_no, f"invalid exemplar: {e}")
            return False
        if self.parser.keep_exemplars:
            self.exemplars.append(exemplar)
        return True

    def careful(self, line_no: int, line: str) -> None:
        """Parse a sample line the fast path did not take, with precise errors."""
        try:
            s = scan_sample(line, self.om)
            labels, le, quantile = label_entry(s.pairs)
            value = parse_float(s.value)
            t = timestamp_ms(s.timestamp, self.om) if s.timestamp else self.default_ts
            exemplar = None
            if s.exemplar is not None:
                pairs, ev, ets = s.exemplar
                exemplar = Exemplar(
                    len(self.samples),
                    label_entry(pairs)[0],
                    parse_float(ev),
                    timestamp_ms(ets, True) if ets else None,
                )
        except LineError as e:
            self.error(line_no, str(e), line)
            return
        if s.name in self.checks and not self.check(line_no, s.name, le, quantile):
            return
        self.seen.add(s.name)
        if exemplar is not None and self.parser.keep_exemplars:
            self.exemplars.append(exemplar)
        self.samples.append((s.name, labels, t, value))
        if not self.om:
            self.keys.append(None)

    def other(self, line_no: int, line: str) -> None:
        """Handle a line that is not a plain sample: blank, comment, metadata, odd sample or garbage."""
        if line_no in self.bad:
            self.error(line_no, "not valid UTF-8", "")
            return
        om = self.om
        if self.eof_line:
            return  # reported by finish_openmetrics
        if om and line.endswith("\r"):
            self.error(
                line_no, "carriage return at the end of the line (OpenMetrics lines end with \\n only)", line
            )
            return
        stripped = line if om else line.lstrip(" \t").rstrip("\r")
        if not stripped:
            if om:
                self.error(line_no, "blank line (not allowed in OpenMetrics)", line)
            return
        if stripped[0] != "#":
            self.careful(line_no, line)
            return
        comments = self.parser._comments[om]
        meta = comments.get(stripped)
        if meta is None:
            try:
                meta = scan_comment(stripped, om)
            except LineError as e:
                self.error(line_no, str(e), line)
                return
            if len(comments) > self.parser.max_cache:
                comments.clear()
            comments[stripped] = meta
        if meta.kind == "EOF":
            self.eof_line = line_no
            self.at_eof = (len(self.samples), len(self.exemplars))
        elif meta.kind:
            self.metadata(line_no, line, meta.kind, meta.name, meta.text)

    def metadata(self, line_no: int, line: str, kind: str, name: str, text: str) -> None:
        """Record HELP/TYPE/UNIT for family `name`, reporting repeats and late metadata."""
        key = (kind, name)
        if key in self.declared:
            self.error(line_no, f"second {kind} line for metric name {name!r}", line)
            return
        if (kind == "TYPE" or self.om) and any(name + s in self.seen for s in _SUFFIXES):
            self.error(line_no, f"{kind} line for metric name {name!r} after its samples", line)
            return
        self.declared.add(key)
        entry = self.meta.setdefault(name, ["unknown", "", ""])
        if kind == "TYPE":
            entry[0] = text
            if text in ("histogram", "gaugehistogram"):
                self.checks[name + "_bucket"] = "le"
            elif text == "summary":
                self.checks[name] = "quantile"
        elif kind == "HELP":
            entry[1] = text
        else:
            entry[2] = text
