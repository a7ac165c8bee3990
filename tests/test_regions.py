"""Marked regions (ratchet.regions): found in any comment syntax, their numbers read as parameters with bounds and
annotations, and values written back byte for byte."""

from __future__ import annotations

import pytest

from ratchet.regions import RegionError, extract, find_regions, format_value, substitute

CPP = """#include <cstdio>
int helper() { return 42; }
// EVOLVE-BLOCK-START
const double gain = 0.5;   /* was 7 */ const int rounds = 8;  // ratchet: ; rounds 1..32
const char* label = "v2 3.5";  float f = 1.5f;  int x2 = 3e-4 > 0; char c = '7';
double tiny = 1e-3;        // ratchet: tiny 1e-5..0.1 log
int keep = 100;            // ratchet: fixed
// EVOLVE-BLOCK-END
int main() { return 9; }
"""


def test_cpp_region_numbers_are_parameters_and_nothing_outside_is():
    lits = extract(CPP, "src/main.cpp")
    assert [(x.name, x.text, x.is_int) for x in lits] == [
        ("src_main_cpp_L4", "0.5", False), ("rounds", "8", True), ("src_main_cpp_L5", "1.5", False),
        ("src_main_cpp_L5_2", "3e-4", False), ("src_main_cpp_L5_3", "0", True), ("tiny", "1e-3", False)]
    by = {x.name: x for x in lits}
    assert (by["src_main_cpp_L4"].low, by["src_main_cpp_L4"].high) == (0.0, 1.0)  # [0, 2v] by default
    assert (by["rounds"].low, by["rounds"].high) == (1.0, 32.0)
    assert (by["tiny"].low, by["tiny"].high, by["tiny"].scale) == (1e-5, 0.1, "log")
    assert (by["src_main_cpp_L5_3"].low, by["src_main_cpp_L5_3"].high) == (0.0, 1.0)  # zero: [0, 1]


def test_values_written_back_change_only_the_literals():
    lits = extract(CPP, "main.cpp")
    assert substitute(CPP, lits, {x.name: x.value for x in lits}) == CPP  # the same values: byte for byte
    out = substitute(CPP, lits, {"main_cpp_L4": 0.25, "rounds": 12.6, "main_cpp_L5": 2.0, "tiny": 1e-05})
    assert out == CPP.replace("gain = 0.5", "gain = 0.25").replace("rounds = 8", "rounds = 13") \
        .replace("f = 1.5f", "f = 2.0f").replace("tiny = 1e-3", "tiny = 1e-05")
    assert [x.value for x in extract(out, "main.cpp")][:2] == [0.25, 13.0]  # reads back as written
    assert "gain = (-0.75);" in substitute(CPP, lits, {"main_cpp_L4": -0.75})  # a sign is the expression's


@pytest.mark.parametrize("comment, close", [("#", ""), ("--", ""), (";", ""), ("//", ""), ("/*", " */")])
def test_any_comment_syntax_marks_a_region(comment, close):
    text = (f"x = 1\n{comment} EVOLVE-BLOCK-START{close}\ny = 2.5 {comment} 9 in a comment\n"
            f"{comment} EVOLVE-BLOCK-END{close}\nz = 3\n")
    assert [(x.text, x.line) for x in extract(text, "p")] == [("2.5", 3)]
    assert len(find_regions(text)) == 1


def test_python_strings_and_rust_suffixes_and_lifetimes():
    py = "# EVOLVE-BLOCK-START\ns = 'a 4 b'; k = 2_000\n# EVOLVE-BLOCK-END\n"
    assert [(x.text, x.value) for x in extract(py, "p.py")] == [("2_000", 2000.0)]
    rs = "// EVOLVE-BLOCK-START\nfn f<'a>(x: &'a [f64]) -> f64 { 0.25f64 * x[3usize] }\n// EVOLVE-BLOCK-END\n"
    lits = extract(rs, "lib.rs")
    assert [x.text for x in lits] == ["0.25", "3"]
    assert substitute(rs, lits, {lits[0].name: 0.5}).count("0.5f64") == 1


def test_format_value():
    assert (format_value(2.0, False), format_value(2.4, True), format_value(-0.25, False)) == ("2.0", "2", "(-0.25)")


@pytest.mark.parametrize("text, message", [
    ("// EVOLVE-BLOCK-START\nx = 1;\n", "never closed"),
    ("x;\n// EVOLVE-BLOCK-END\n", "without an EVOLVE-BLOCK-START"),
    ("// EVOLVE-BLOCK-START\n// EVOLVE-BLOCK-START\n// EVOLVE-BLOCK-END\n", "inside the region"),
    ("// EVOLVE-BLOCK-START\nx = 5; // ratchet: 0..1\n// EVOLVE-BLOCK-END\n", "outside its bounds"),
    ("// EVOLVE-BLOCK-START\nx = 5; // ratchet: 0..9 wat?\n// EVOLVE-BLOCK-END\n", "not a name"),
    ("// EVOLVE-BLOCK-START\nx = 5; // ratchet: a; b\n// EVOLVE-BLOCK-END\n", "2 items for 1"),
    ("// EVOLVE-BLOCK-START\nx = 5; // ratchet: 0..9 log\ny = 0; // ratchet: -1..1 log\n// EVOLVE-BLOCK-END\n",
     "LOW > 0"),
])
def test_mistakes_are_one_line_naming_file_and_line(text, message):
    with pytest.raises(RegionError, match=message) as info:
        extract(text, "m.c")
    assert str(info.value).startswith("m.c:") and "\n" not in str(info.value)


def test_numbers_in_a_docstring_spanning_lines_are_not_parameters():
    """A Python docstring (or any triple-quoted string of a ``#`` file) spanning lines is text, as a one-line string
    is: OpenEvolve's circle-packing program documents ``shape (26, 2)`` inside its region."""
    from ratchet.regions import extract

    text = ('# EVOLVE-BLOCK-START\ndef f():\n    """Place 26 circles.\n\n    Returns: shape (26, 2)\n    """\n'
            '    n = 26\n    s = \'\'\'x 3\ny 4\'\'\' ; k = 5\n    return n\n# EVOLVE-BLOCK-END\n')
    assert [(lit.line, lit.text) for lit in extract(text, "p.py")] == [(7, "26"), (9, "5")]


@pytest.mark.parametrize("annotation, message", [
    ("gap banana", "gives a name twice"),
    ("gap 0..0.1 0..0.2", "gives a LOW..HIGH twice"),
    ("gap fixed 0..0.1", "fixed stands alone"),
])
def test_an_annotation_that_says_a_thing_twice_is_one_clear_line(annotation, message):
    from ratchet.regions import RegionError, extract

    text = f"// EVOLVE-BLOCK-START\ndouble gap = 0.02; // ratchet: {annotation}\n// EVOLVE-BLOCK-END\n"
    with pytest.raises(RegionError, match=message):
        extract(text, "main.c")
