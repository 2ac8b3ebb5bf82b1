"""Every command the docs give a reader is real: each `tkp` line parses with the CLI's own parser,
each `make` target and variable is in the Makefile, each `--set` / `PIPELINE_*` name is a config
field, each repository path a command or a code span names exists. A renamed flag, target or
file fails here, not in a reader's terminal.

What is read: README.md and kubeflow/README.md, their fenced shell blocks (no language, bash, sh,
shell, console) line by line, and their inline code spans that start with a command. Words in
capitals (`N`, `NS`, `<name>`, `...`) are placeholders: they may fail a value's type, never a
flag's or a target's name.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex

import pytest

from components.base.config import ENV_PREFIX, FIELDS, OTHER_ENV, REPO_ROOT
from pipelines.cli import build_parser

DOCS = ("README.md", "kubeflow/README.md")
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", "$(", "`"}
_PLACEHOLDER = re.compile(r"^[\[<(]?(\.\.\.|[A-Z][A-Z0-9_]*(\[?[:=][A-Z0-9_\[\]:]*)?)[\]>)]?$")
_REPO_PATH = re.compile(r"^(kubeflow|components|pipelines|schemas|tests|bench|\.ci)/[\w./-]*$")
# What each make target hands its ARGS to (the Makefile's recipes).
MAKE_COMMAND = {"run": "run", "add-span": "add-span", "store": "store", "bench": "bench",
                "compile": "compile", "submit": "submit", "schedule": "schedule",
                "images": "images"}  # fmt: skip
_TKP = ("tkp", ".venv/bin/tkp")
# README's own use case walk-through names the files a reader creates for a use case "churn".
_READERS_OWN = re.compile(r"[/-]churn[/.]")


def doc_commands(text: str) -> list[tuple[int, str, bool]]:
    """(line number, command line, from a fenced block) for each shell line of a Markdown text."""
    found: list[tuple[int, str, bool]] = []
    fenced: list[tuple[int, int]] = []
    for block in _FENCE.finditer(text):
        fenced.append(block.span())
        if block.group(1).lower() not in SHELL_FENCES:
            continue
        first = text.count("\n", 0, block.start(2)) + 1
        pending, start = "", first
        for offset, line in enumerate(block.group(2).splitlines()):
            if not pending:
                start = first + offset
            line = line.removeprefix("$ ")
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            if _quote_open(pending + line):
                pending += line + "\n"
                continue
            found.append((start, pending + line, True))
            pending = ""
        if pending and block.group(1):  # a quote never closed; in a plain block, not shell
            found.append((start, pending, True))
    for span in _SPAN.finditer(text):
        if any(a <= span.start() < b for a, b in fenced):
            continue
        words = span.group(1).split()
        command = next((w for w in words if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)), "")
        if command in ("make", *_TKP) or _REPO_PATH.match(span.group(1)):
            found.append((text.count("\n", 0, span.start()) + 1, span.group(1), False))
    return found


def _quote_open(line: str) -> bool:
    try:
        shlex.split(line, comments=True)
    except ValueError as e:
        return "closing quotation" in str(e)
    return False


def simple_commands(line: str) -> list[list[str]]:
    """A shell line split into its simple commands' words (comments dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, words = [], []
    for token in lexer:
        if token in _SEPARATORS or set(token) <= set("&|;()"):
            commands.append(words)
            words = []
        else:
            words.append(token)
    return [c for c in commands + [words] if c]


def makefile() -> tuple[set[str], set[str]]:
    """The Makefile's targets and the variables it reads."""
    text = (REPO_ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w.-]+):(?!=)", text, re.M))
    variables = set(re.findall(r"^(\w+)\s*[?:]?=", text, re.M))
    return targets, variables


def _config_name_problems(words: list[str]) -> list[str]:
    problems = []
    for flag, value in zip(words, words[1:], strict=False):
        if flag == "--set" and not _PLACEHOLDER.match(value):
            name = value.partition("=")[0]
            if name not in FIELDS:
                problems.append(f"--set {name}: no such config field")
    return problems


def _environment_problems(assignments: list[str]) -> list[str]:
    problems = []
    for assignment in assignments:
        name = assignment.partition("=")[0]
        if name.startswith(ENV_PREFIX) and name not in OTHER_ENV:
            if name[len(ENV_PREFIX) :].lower() not in FIELDS:
                problems.append(f"{name}: no such config field")
    return problems


def _tkp_problems(words: list[str], whole: bool = True) -> list[str]:
    """What the CLI's parser refuses in `tkp WORDS`, less a placeholder's failed value type; of a
    fragment (`whole` False: a command named in prose), a missing argument or value too."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(words)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            message = stderr.getvalue().strip().splitlines()[-1]
            value = re.search(r"'([^']*)'$", message)
            fragment = not whole and re.search(r"arguments are required|expected one", message)
            if not (fragment or value and _PLACEHOLDER.match(value.group(1))):
                return [message]
    return _config_name_problems(words)


def _subcommand_flags(command: str) -> set[str]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    return set(subparsers.choices[command]._option_string_actions)


def _make_problems(words: list[str]) -> list[str]:
    targets, variables = makefile()
    problems = []
    asked = [w for w in words if "=" not in w and not w.startswith("-")]
    for target in asked:
        if target not in targets and not _PLACEHOLDER.match(target):
            problems.append(f"make {target}: no such target in the Makefile")
    for assignment in (w for w in words if "=" in w):
        name, _, value = assignment.partition("=")
        if name not in variables:
            problems.append(f"make {name}=: the Makefile reads no variable {name}")
        elif name == "ARGS" and asked and asked[0] in MAKE_COMMAND:
            try:
                args = shlex.split(value)
            except ValueError as e:
                problems.append(f"ARGS={value}: {e}")
                continue
            command = MAKE_COMMAND[asked[0]]
            known = _subcommand_flags(command)
            unknown = [a for a in args if a.startswith("-") and a.partition("=")[0] not in known]
            problems += [
                f"make {asked[0]} ARGS: {a} is not a flag of tkp {command}" for a in unknown
            ]
            problems += _config_name_problems(args)
    return problems


def line_problems(line: str, whole: bool = True) -> list[str]:
    """Every way a documented command line does not match the CLI, the Makefile or the tree
    (`whole` False: a command named in prose, whose required arguments may be left out)."""
    problems = []
    for words in simple_commands(line):
        assignments = []
        while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
            assignments.append(words.pop(0))
        while words and words[0] in ("env", "time", "nohup", "sudo"):
            words.pop(0)
        if not words:
            continue
        if words[0] == "export":  # `export PIPELINE_X=...` sets what later commands read
            problems += _environment_problems([w for w in words[1:] if "=" in w])
        elif words[0] == "make":
            problems += _make_problems(words[1:]) + _environment_problems(assignments)
        elif words[0] in _TKP:
            problems += _tkp_problems(words[1:], whole) + _environment_problems(assignments)
        elif words[:3] == ["python", "-m", "pipelines.cli"]:
            problems += _tkp_problems(words[3:], whole) + _environment_problems(assignments)
        for word in words:
            path = word.partition("=")[2] if "=" in word else word
            if _REPO_PATH.match(path) and "..." not in path and not _READERS_OWN.search(path):
                if (REPO_ROOT / path).exists():
                    continue
                problems.append(f"{path}: no such file in the repository")
    return problems


@pytest.mark.parametrize("doc", DOCS)
def test_every_documented_command_flag_target_and_path_is_real(doc: str) -> None:
    found = []
    for number, line, is_fenced in doc_commands((REPO_ROOT / doc).read_text()):
        try:
            problems = line_problems(line, whole=is_fenced)
        except ValueError as e:  # unbalanced quotes: a broken line in a block, prose in a span
            problems = [f"cannot be read as a shell line ({e})"] if is_fenced else []
        found += [f"{doc}:{number}: {line.strip()}\n    {p}" for p in problems]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line, expected",
    [
        ("make run ARGS='--set force=1'", []),
        ("PIPELINE_SPAN=0 make run ARGS=--set\\ force=1", []),
        ("make runn", ["make runn: no such target in the Makefile"]),
        ("make run ARG=--keep-store", ["make ARG=: the Makefile reads no variable ARG"]),
        ("make run ARGS=--keep-stor", ["make run ARGS: --keep-stor is not a flag of tkp run"]),
        ("make run ARGS='--set forse=1'", ["--set forse: no such config field"]),
        ("PIPELINE_SPANN=0 make run", ["PIPELINE_SPANN: no such config field"]),
        ("export PIPELINE_CPU_IMAGES=x/y:1", ["PIPELINE_CPU_IMAGES: no such config field"]),
        ("tkp rollback N", []),
        (
            "tkp rollback three",
            ["tkp rollback: error: argument version: invalid int value: " "'three'"],
        ),  # fmt: skip
        ("tkp serv", None),
        ("cd x && tkp models list --verbose", ["tkp: error: unrecognized arguments: --verbose"]),
        (
            "kubectl apply -f kubeflow/serving/nope.yaml",
            ["kubeflow/serving/nope.yaml: no such file in the repository"],
        ),  # fmt: skip
    ],
)
def test_the_check_refuses_what_a_reader_could_not_run(line: str, expected: list | None) -> None:
    problems = line_problems(line)
    if expected is None:
        assert problems and "invalid choice: 'serv'" in problems[0]
    else:
        assert [p.replace("python -m pipelines.cli", "tkp") for p in problems] == expected


def test_the_readme_configuration_table_names_every_config_field() -> None:
    """README's Configuration section says all settings are fields of PipelineConfig and lists
    them: a field added to the config and not to the table fails here."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text[
        text.index("## Configuration") : text.index("\n## ", text.index("## Configuration"))
    ]
    named = set()
    for row in re.findall(r"^\| (`[^|]+)\|", section, re.M):
        named |= set(re.findall(r"`([a-z_0-9]+)`", row))
    assert set(FIELDS) - named == set()
    assert named - set(FIELDS) == set()


def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but `-` and `_` dropped,
    spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS)
def test_each_contents_link_leads_to_a_heading(doc: str) -> None:
    """Both docs open with a table of contents: each `(#anchor)` link in them is a heading's."""
    text = (REPO_ROOT / doc).read_text()
    headings = {_github_anchor(h) for h in re.findall(r"^#{2,4} (.+)$", text, re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert len(links) >= 10  # the contents
    assert [link for link in links if link not in headings] == []
    assert text.index("## Contents") < 3000  # on the first screen or two
