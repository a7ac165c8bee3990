"""mkdocs hooks: the spec and CLI references, generated from the code at build time (never checked in).

``docs/reference/spec.md`` and ``docs/reference/cli.md`` are hand-written pages holding a marker line; at build
time the marker is replaced by tables generated from the pydantic models of :mod:`ratchet.spec` (and every
registered ``[[refiners]]`` kind's settings model) and from the Typer app of :mod:`ratchet.cli`. The functions
that generate them need no mkdocs, so ``tests/test_docs.py`` calls them too.
"""

from __future__ import annotations

import html
import inspect
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SPEC_MARKER = "<!-- generated: spec reference -->"
CLI_MARKER = "<!-- generated: cli reference -->"
LAYERS_MARKER = "<!-- generated: layers -->"
ROOT = Path(__file__).resolve().parents[1]


# --- spec reference ---------------------------------------------------------------------------------------------

def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f'`"{a}"`' if isinstance(a, str) else f"`{a}`" for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        parts = [a for a in args if a is not type(None)]
        return " \\| ".join(_type_name(a) for a in parts)
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict or annotation is dict:
        return "table"
    names = {int: "integer", float: "number", str: "string", bool: "boolean"}
    if annotation in names:
        return names[annotation]
    return getattr(annotation, "__name__", str(annotation))


def _number(x: Any) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return f"{x:,}" if abs(x) < 10**7 else (f"2^{x.bit_length()} − 1" if x == 2 ** (x.bit_length()) - 1
                                                 else f"{x:.0e}".replace("e+0", "e").replace("e+", "e"))
    if float(x).is_integer() and abs(x) < 10**7:
        return f"{int(x):,}"
    return f"{x:g}".replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, bool):
        return f"`{'true' if value else 'false'}`"
    if isinstance(value, (int, float)):
        return f"`{_number(value)}`"
    if isinstance(value, (list, tuple)):
        return "`[" + ", ".join(f'"{v}"' if isinstance(v, str) else _number(v) for v in value) + "]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value}`"


def _range(field: Any) -> str:
    words = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))
    parts = []
    for m in field.metadata:
        for attr, sign in words:
            if getattr(m, attr, None) is not None:
                parts.append(f"{sign} {_number(getattr(m, attr))}")
        if getattr(m, "min_length", None) is not None:
            parts.append(f"length ≥ {m.min_length}")
        if getattr(m, "max_length", None) is not None:
            parts.append(f"length ≤ {m.max_length:,}")
        if getattr(m, "pattern", None) is not None:
            parts.append(f"matches `{m.pattern}`")
    return ", ".join(parts)


def _unit(field: Any) -> str:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return str(extra.get("unit", ""))


def _rst(text: str) -> str:
    """reST inline markup of docstrings as Markdown: ``code`` and :role:`~target` as `code`."""
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text.replace("``", "`"))


def _model_doc(model: type) -> str:
    """The first paragraph of a settings model's docstring (reST ``code`` as Markdown `code`)."""
    doc = inspect.cleandoc(model.__doc__ or "")
    return _rst(doc.split("\n\n", 1)[0].replace("\n", " "))


def spec_sections() -> Iterator[tuple[str, str, type, list[tuple[str, Any]], list[str]]]:
    """Every spec section: ``(title, anchor, model, [(key, pydantic field), …], refiner kinds)``. The top-level keys first,
    then each ``[section]`` of :class:`ratchet.spec.RunSpec` in order (a section added there appears here), and
    one ``[[refiners]]`` section per registered refiner kind."""
    from pydantic import BaseModel

    from ratchet.refiners.registry import known_kinds, refiner_kind
    from ratchet.spec import RunSpec

    top = [(k, f) for k, f in RunSpec.model_fields.items()
           if k != "base_dir" and not (isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel))]
    yield "Top-level keys", "top-level", RunSpec, top, []
    for key, field in RunSpec.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            yield f"[{key}]", key, model, list(model.model_fields.items()), []
    kinds: dict[type, list[str]] = {}
    for kind in known_kinds():
        kinds.setdefault(refiner_kind(kind).settings, []).append(kind)
    for model, names in kinds.items():
        title = " / ".join(f'kind = "{n}"' for n in names)
        yield f"[[refiners]] {title}", "refiners-" + "-".join(names), model, list(model.model_fields.items()), names


def spec_reference() -> str:
    """The spec reference in Markdown: one table per section, every key with its type, default, range, unit
    and description."""
    from ratchet.refiners.registry import refiner_kind

    out = []
    for title, anchor, model, fields, kinds in spec_sections():
        out.append(f"## `{title}` {{ #{anchor} }}\n")
        if kinds:
            kind = refiner_kind(kinds[0])
            out.append(f"Refines {', '.join(f'`{k}`' for k in kind.policy_kinds)} policies. "
                       "Every table also takes `kind` and an optional `name` (the arm's name; default the kind, "
                       "numbered when repeated).\n")
        doc = _model_doc(model)
        if doc and model.__name__ != "RunSpec":
            out.append(_cell(doc).replace("\\|", "|") + "\n")
        out.append("| key | type | default | range | unit | description |")
        out.append("|---|---|---|---|---|---|")
        for key, field in fields:
            out.append(f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | {_cell(_range(field))} | "
                       f"{_cell(_unit(field))} | {_cell(_rst(field.description or ''))} |")
        out.append("")
    return "\n".join(out)


# --- CLI reference ----------------------------------------------------------------------------------------------

def _unescape(text: str | None) -> str:
    """A help text as written (ratchet.cli escapes Rich markup: ``\\[task]``)."""
    return re.sub(r"\\\[", "[", text or "")


def cli_commands() -> list[tuple[str, Any]]:
    """``[(name, click command), …]`` of the ``ratchet`` Typer app, in the order ``--help`` lists them."""
    import typer

    from ratchet.cli import app

    group = typer.main.get_command(app)
    return [("", group), *group.commands.items()]  # type: ignore[attr-defined]


def cli_reference() -> str:
    """The CLI reference in Markdown: every command, its arguments and options with help, default and range (as
    ``--help`` prints them)."""
    out = []
    for name, cmd in cli_commands():
        ctx = cmd.context_class(cmd, info_name=f"ratchet {name}".strip())
        title = f"ratchet {name}".strip()
        out.append(f"## `{title}` {{ #{name or 'ratchet'} }}\n")
        usage = cmd.get_usage(ctx).removeprefix("Usage: ")
        out.append(f"```\n{usage}\n```\n")
        help_text = _unescape(cmd.help)
        if help_text:
            out.append(html.escape(inspect.cleandoc(help_text), quote=False) + "\n")
        rows = [p.get_help_record(ctx) for p in cmd.params if not getattr(p, "hidden", False)]
        rows = [r for r in rows if r is not None]
        if rows:
            out.append("| argument / option | description |")
            out.append("|---|---|")
            for names, text in rows:
                out.append(f"| `{_unescape(names)}` | {_cell(_unescape(text))} |")
            out.append("")
    return "\n".join(out)


# --- the layer stack -----------------------------------------------------------------------------------------

def layers() -> str:
    """The layer stack of ``tests/test_layers.py`` (its ``LAYERS`` list, top first), one line per layer as a code
    block; parts the test's source lists on one line are peers and share a line here."""
    import ast

    source = (ROOT / "tests" / "test_layers.py").read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAYERS" for t in node.targets):
            rows: dict[int, list[str]] = {}
            for elt in node.value.elts:  # type: ignore[attr-defined]
                rows.setdefault(elt.lineno, []).append(elt.value)
            return "```\n" + "\n".join(" / ".join(r) for r in rows.values()) + "\n```\n"
    raise RuntimeError("tests/test_layers.py has no LAYERS list")


# --- mkdocs hook ------------------------------------------------------------------------------------------------

_ROLE_FULL = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):<code>~?([\w.()]+)</code>")


def on_page_content(html_text: str, page: Any, config: Any, files: Any) -> str:
    """Docstrings cite code with reST roles (``:class:`~ratchet.policy.Candidate```), which the API page renders
    as text; show them as code, the ``~`` form by its last name as Sphinx does."""
    html_text = re.sub(r":(?:class|func|meth|mod|attr|data|exc|obj):<code>~([\w.]+)</code>",
                       lambda m: f"<code>{m.group(1).rsplit('.', 1)[-1]}</code>", html_text)
    return _ROLE_FULL.sub(r"<code>\1</code>", html_text)

def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker lines of the reference pages with their generated content."""
    if SPEC_MARKER in markdown:
        markdown = markdown.replace(SPEC_MARKER, spec_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if LAYERS_MARKER in markdown:
        markdown = markdown.replace(LAYERS_MARKER, layers())
    return markdown
