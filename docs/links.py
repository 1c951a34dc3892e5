"""Keep the docs' line links pointing at the lines they explain.

A page links to one line of a source file, and says, as the link's title, what that line holds:

    [layer_norm_backward_input](../microtensor/ops/layer_norm.py#L85 "def layer_norm_backward_input")

When the file changes and the line moves, the number goes stale but the title does not, so the
number can be found again: it is the first line of the file that contains the title.

    python docs/links.py --check    # list every stale or broken reference; exit 1 if there is one
    python docs/links.py --fix      # rewrite every stale number, then list what could not be fixed

It looks at README.md and every docs/**/*.md (or the pages given after the flag), and knows four
kinds of reference:

1. A Markdown link with a `#L<n>` anchor and a title, as above. The anchor is fresh when line n
   contains the title. Otherwise --fix moves it to the one line that contains the title; no such
   line, several such lines, or a `#L<n>` link without a title, is an error that needs a person.
2. A frame of a pasted pdb session, inside a fenced block: a line such as
   `> microtensor/ops/layer_norm.py(84)layer_norm_backward_input()` followed by the line
   `-> d_sum = zero` that pdb prints below it. Its text is the `->` line, looked for inside the
   function pdb names (several lines holding that text there is an error, as for a link).
   Paths are relative to the repository's root (paste sessions with the root's prefix removed);
   frames in files outside the repository (Python's own) are left alone.
3. A breakpoint: `b microtensor/ops/layer_norm.py:84` (also `break` and `tbreak`, in prose or in
   a block; the path from the root, or with a leading `../` from a folder such as examples/) and
   pdb's answer `Breakpoint 1 at microtensor/ops/layer_norm.py:84`. It has no text of its own: it
   must name a line that a link or a frame of the same page names, and moves with it.
4. A line count: in a table under a heading that contains "Read in this order", a row whose second
   cell is a link to a file and whose third cell is a number,

       | 3 | [microtensor/autograd.py](../microtensor/autograd.py) | 404 | Function, Context, ... |

   The number must be the file's count of lines (as `wc -l` counts them); --fix rewrites it.
   Rows of other shapes (a third cell that is not a number) are left alone.

Every other relative link (`[the example](../examples/step_backward.py)`) must name a file that
exists, and a link to a heading (`autodiff.md#vjp-and-jvp`) a heading that exists.

A stale number (a line that moved, a file that grew) still leads a reader near the right place, so
tests/test_docs.py fails only on what --fix cannot repair; `--check` runs in CI before the tests,
so that no stale number is ever merged.
"""
import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^[ \t]*(```+|~~~+)", re.MULTILINE)
# [text](target#L12 "title") -- the text may hold nested brackets of inline code, not a "]("
LINE_LINK = re.compile(r"\]\(\s*(?P<target>[^)\s#]+)#L(?P<line>\d+)(?:\s+\"(?P<title>[^\"]*)\")?\s*\)")
ANY_LINK = re.compile(r"\]\(\s*(?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
FRAME = re.compile(r"^(?:> |  )?(?P<path>[^\s()<>]+\.py)\((?P<line>\d+)\)(?P<function>[\w<>]+)\(\)[ \t]*\n-> (?P<text>.*)$", re.MULTILINE)
LINE_COUNT_ROW = re.compile(r"^\|[^|\n]*\|\s*\[[^\]\n]*\]\(\s*(?P<target>[^)\s#]+)\s*\)\s*\|\s*(?P<count>\d+)\s*\|", re.MULTILINE)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
READING_ORDER = "Read in this order"
BREAK = re.compile(r"(?:\b(?:b|break|tbreak)[ \t]+|\b[Bb]reakpoint \d+ at )(?P<path>[\w./-]+\.py):(?P<line>\d+)\b")


@dataclass
class Reference:
    page: Path  # the Markdown file
    start: int  # where the line number is written in the page (character offsets)
    end: int
    source: Path  # the file the reference points into
    line: int  # the line number written in the page (1-based)
    text: str = None  # what that line must hold (None: a breakpoint, which borrows a line)
    exact: bool = False  # frames: the stripped line equals text; links: the line contains text
    function: str = None  # frames: the function pdb named
    kind: str = "link"

    def where(self):
        row = self.page.read_text(encoding="utf-8").count("\n", 0, self.start) + 1
        return f"{shown(self.page)}:{row}"


def shown(path):
    """A path as the messages show it: from the repository's root when it lies inside."""
    return path.relative_to(ROOT) if ROOT in path.parents else path


def pages():
    """README.md and every Markdown file under docs/."""
    found = [ROOT / "README.md"] if (ROOT / "README.md").exists() else []
    return found + sorted((ROOT / "docs").rglob("*.md"))


def fenced_spans(text):
    """(start, end) character offsets of every fenced code block in a Markdown text."""
    spans, opened = [], None
    for match in FENCE.finditer(text):
        if opened is None:
            opened = match
        elif match.group(1)[0] == opened.group(1)[0] and len(match.group(1)) >= len(opened.group(1)):
            spans.append((opened.start(), match.end()))
            opened = None
    if opened is not None:
        spans.append((opened.start(), len(text)))
    return spans


def heading_anchors(page):
    """The anchors GitHub gives the headings of a Markdown file: lower case, punctuation dropped,
    spaces made hyphens, and -1, -2, ... added to repeats."""
    text = page.read_text(encoding="utf-8")
    spans = fenced_spans(text)
    anchors, seen = set(), {}
    for match in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, re.MULTILINE):
        if _inside(match.start(), spans):
            continue
        slug = re.sub(r"[^\w\- ]", "", match[1].strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _inside(offset, spans):
    return any(start <= offset < end for start, end in spans)


def references(page):
    """Every reference to a line in `page`, and the problems found while reading them."""
    text = page.read_text(encoding="utf-8")
    spans = fenced_spans(text)
    found, problems = [], []
    for match in LINE_LINK.finditer(text):
        if _inside(match.start(), spans):
            continue
        source = (page.parent / match["target"]).resolve()
        reference = Reference(page, match.start("line"), match.end("line"), source, int(match["line"]), match["title"])
        if match["title"] is None or not match["title"].strip():
            problems.append(f"{reference.where()}: the link to {match['target']}#L{match['line']} has no title; "
                            'write the text of that line as its title: (path#Ln "text on line n")')
        elif not source.is_file():
            problems.append(f"{reference.where()}: {match['target']} does not exist")
        else:
            found.append(reference)
    for match in ANY_LINK.finditer(text):
        target = match["target"]
        if _inside(match.start(), spans) or re.match(r"^[a-z][a-z0-9+.-]*:|^<", target):
            continue  # a web address
        file_part, _, anchor = target.partition("#")
        path = (page.parent / file_part).resolve() if file_part else page
        reference = Reference(page, match.start(), match.end(), path, 0)
        if not path.exists():
            problems.append(f"{reference.where()}: the link to {target} names no file")
        elif anchor and path.suffix == ".md" and anchor not in heading_anchors(path):
            problems.append(f"{reference.where()}: the link to {target} names no heading of {path.name} "
                            f"(its headings: {', '.join(sorted(heading_anchors(path)))})")
    for match in FRAME.finditer(text):
        if not _inside(match.start(), spans):
            continue
        source = (ROOT / match["path"]).resolve()
        if not source.is_file() or ROOT not in source.parents:
            continue  # Python's own files, <string>, ...: not ours to keep fresh
        found.append(Reference(page, match.start("line"), match.end("line"), source, int(match["line"]),
                               match["text"].strip(), exact=True, function=match["function"], kind="frame"))
    found += line_counts(page, text, spans, problems)
    for match in BREAK.finditer(text):
        # a path relative to the root, or to a folder one level down (`b ../microtensor/...` from examples/)
        source = (ROOT / match["path"]).resolve()
        if not source.is_file():
            source = (ROOT / re.sub(r"^(\.\./)+", "", match["path"])).resolve()
        if not source.is_file() or ROOT not in source.parents:
            continue
        found.append(Reference(page, match.start("line"), match.end("line"), source, int(match["line"]), kind="breakpoint"))
    return found, problems


def line_counts(page, text, spans, problems):
    """The line counts of the "Read in this order" tables of a page (references of kind "count")."""
    found, headings = [], [m for m in HEADING.finditer(text) if not _inside(m.start(), spans)]
    for heading, following in zip(headings, headings[1:] + [None]):
        if READING_ORDER.lower() not in heading[1].lower():
            continue
        section_end = following.start() if following else len(text)
        for match in LINE_COUNT_ROW.finditer(text, heading.end(), section_end):
            source = (page.parent / match["target"]).resolve()
            reference = Reference(page, match.start("count"), match.end("count"), source, int(match["count"]), kind="count")
            if not source.is_file():
                problems.append(f"{reference.where()}: the reading order's row for {match['target']} names no file")
            else:
                found.append(reference)
    return found


_lines = {}


def source_lines(path):
    if path not in _lines:
        _lines[path] = path.read_text(encoding="utf-8").splitlines()
    return _lines[path]


def _holds(reference, line_text):
    return line_text.strip() == reference.text if reference.exact else reference.text in line_text


def function_lines(lines, function):
    """The numbers of the lines of every function called `function` in a file (a method's name may
    recur in several classes): from its `def` to the last line indented deeper than the `def`."""
    definition = re.compile(rf"^(\s*)(?:async\s+)?def\s+{re.escape(function)}\b")
    numbers = set()
    for start, line in enumerate(lines, 1):
        match = definition.match(line)
        if not match:
            continue
        indent = len(match.group(1))
        end = start
        for number in range(start + 1, len(lines) + 1):
            body = lines[number - 1]
            if body.strip() and len(body) - len(body.lstrip()) <= indent and not body.lstrip().startswith(")"):
                break
            end = number
        numbers.update(range(start, end + 1))
    return numbers


def locate(reference):
    """(the line the reference should name, None) or (None, the reason it cannot be found); for a
    line count, (the file's count of lines, None)."""
    if reference.kind == "count":
        return reference.source.read_bytes().count(b"\n"), None  # what `wc -l` counts
    lines = source_lines(reference.source)
    name = shown(reference.source)
    if 1 <= reference.line <= len(lines) and _holds(reference, lines[reference.line - 1]):
        return reference.line, None
    candidates = [number for number, line in enumerate(lines, 1) if _holds(reference, line)]
    where = ""
    if reference.function and reference.function != "<module>":
        inside = function_lines(lines, reference.function)
        candidates = [number for number in candidates if number in inside]
        where = f" inside {reference.function}"
    if not candidates:
        return None, f"no line of {name}{where} holds {reference.text!r}"
    if len(candidates) > 1:
        remedy = ("make the title longer so that one line matches" if reference.kind == "link"
                  else "paste the session again (a stop at a line whose text is unique is easier to keep)")
        return None, (f"{len(candidates)} lines of {name}{where} hold {reference.text!r} (lines "
                      f"{', '.join(map(str, candidates[:8]))}); {remedy}")
    return candidates[0], None


def scan(given=None):
    """(edits: {page: [(start, end, new number)]}, stale: [messages], problems: [messages]), for the
    pages given (Paths), or pages()."""
    edits, stale, problems = {}, [], []
    for page in pages() if given is None else given:
        found, page_problems = references(page)
        problems += page_problems
        moves = {}  # (source, old line) -> new line, from the references that carry a text
        for reference in found:
            if reference.kind == "breakpoint":
                continue
            new, problem = locate(reference)
            if problem:
                problems.append(f"{reference.where()}: {reference.kind} to line {reference.line}: {problem}")
                continue
            if reference.kind != "count":
                moves.setdefault((reference.source, reference.line), new)
            if new != reference.line and reference.kind == "count":
                edits.setdefault(page, []).append((reference.start, reference.end, new))
                stale.append(f"{reference.where()}: line count of {shown(reference.source)} should be {new} (wc -l), not {reference.line}")
            elif new != reference.line:
                edits.setdefault(page, []).append((reference.start, reference.end, new))
                stale.append(f"{reference.where()}: {reference.kind} {shown(reference.source)}#L{reference.line} "
                             f"should be #L{new} (the line holding {reference.text!r})")
        for reference in found:
            if reference.kind != "breakpoint":
                continue
            key = (reference.source, reference.line)
            if key not in moves:
                problems.append(f"{reference.where()}: the breakpoint at {shown(reference.source)}:{reference.line} "
                                "names a line that no titled link or pasted frame of this page names")
            elif moves[key] != reference.line:
                edits.setdefault(page, []).append((reference.start, reference.end, moves[key]))
                stale.append(f"{reference.where()}: breakpoint {shown(reference.source)}:{reference.line} "
                             f"should be :{moves[key]}")
    return edits, stale, problems


def fixed(text, changes):
    """The text of a page with its stale numbers rewritten (changes: edits[page] from scan)."""
    for start, end, new in sorted(changes, reverse=True):
        text = text[:start] + str(new) + text[end:]
    return text


def fix(edits):
    for page, changes in edits.items():
        page.write_text(fixed(page.read_text(encoding="utf-8"), changes), encoding="utf-8")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="list stale or broken references, exit 1 if any")
    action.add_argument("--fix", action="store_true", help="rewrite stale line numbers in place")
    parser.add_argument("pages", nargs="*", type=Path, help="Markdown pages to look at (default: README.md and docs/**/*.md)")
    args = parser.parse_args(argv)
    edits, stale, problems = scan([page.resolve() for page in args.pages] or None)
    if args.fix:
        fix(edits)
        for message in stale:
            print("fixed:", message)
    else:
        for message in stale:
            print("stale:", message)
    for message in problems:
        print("error:", message)
    if args.check and stale:
        print(f"\n{len(stale)} stale line number(s): run `python docs/links.py --fix`")
    if problems:
        print(f"\n{len(problems)} reference(s) need a person: --fix cannot repair them")
    return 1 if problems or (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
