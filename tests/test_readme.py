"""README.md cannot drift from the scripts: every command in its code blocks parses against the real CLIs (their
argparse, the resolved training config, Accelerate's launcher, the Makefile's targets), its pictures are committed,
and it stays a front page."""

from __future__ import annotations

import importlib
import re
import shlex

import pytest

from conftest import ROOT

README = ROOT / "README.md"
SCRIPTS = ("train_accelerate.py", "sample.py", "evaluate_fid.py", "reconstruct_ema.py")


def shell_commands(markdown: str) -> list[list[str]]:
    """The commands of the plain / shell code blocks: continuation lines joined, comments dropped, `a && b` split."""
    out = []
    for block in re.findall(r"^```(?:sh|bash|shell)?\n(.*?)^```", markdown, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                out.append(words[:cut])
                words = words[cut + 1:]
    return out


def parse(script: str, args: list[str]) -> None:
    """The script's own parser (and for training the config it resolves to, as if on a fresh clone); a bad flag or
    value fails with the script's one-line message."""
    module = importlib.import_module(script.removesuffix(".py"))
    try:
        ns = module.parse_args(args)
    except SystemExit as e:
        pytest.fail(f"{script} {shlex.join(args)}: exit {e.code}")
    if script == "train_accelerate.py":
        from adaptive.config import ConfigError, resolve_config

        try:
            resolve_config(ns, saved={})
        except ConfigError as e:
            pytest.fail(f"{script} {shlex.join(args)}: {e}")


def check(command: list[str], make_targets: set[str]) -> None:
    words = [w for w in command if not re.fullmatch(r"[A-Z_]+=\S*", w)]  # FOO=1 prefixes
    if words[0] == "make":
        assert set(words[1:]) <= make_targets, command
    elif words[:2] == ["pip", "install"]:
        pass
    elif words[0] == "python":
        assert words[1] in SCRIPTS, command
        parse(words[1], words[2:])
    elif words[:2] == ["accelerate", "launch"]:
        from accelerate.commands.launch import launch_command_parser

        launch = launch_command_parser().parse_args(words[2:])
        assert launch.config_file is None or (ROOT / launch.config_file).is_file(), command
        assert launch.training_script in SCRIPTS, command
        parse(launch.training_script, launch.training_script_args)
    else:
        pytest.fail(f"README runs a command the dry check does not know: {shlex.join(command)}")


def test_every_readme_command_parses_against_the_real_clis(capsys):
    text = README.read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    commands = shell_commands(text)
    assert sum(c[0] == "python" for c in commands) >= 7  # the walkthrough: train, sample, score, re-score, resume, push
    for command in commands:
        check(command, targets)
    assert "--like_run" in text and "--push_to_hub" in text and "--resume_from_checkpoint latest" in text


def test_readme_is_a_front_page_with_committed_pictures():
    text = README.read_text()
    assert len(text.splitlines()) <= 120
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(images) >= 2 and all(p.startswith("docs/") and (ROOT / p).is_file() for p in images), images
    assert "../shared" not in text  # the development setup's data are no business of a user's
    for link in re.findall(r"\]\(((?:docs/)[^)#]+)", text):
        assert (ROOT / link).exists(), link


def test_the_dry_check_catches_a_drifted_flag():
    with pytest.raises(pytest.fail.Exception):
        check(["python", "sample.py", "--model_path", "x", "--output_dir", "y", "--num_image", "3"], set())
    with pytest.raises(pytest.fail.Exception):
        check(["python", "train_accelerate.py", "--preset", "cpu-tiny", "--learning_rate", "-1"], set())


def test_the_results_numbers_are_those_of_its_linked_table():
    """Every decimal in README's Result (speed-ups, FDs) is in the committed table it links to, so the front page
    cannot keep a number the table no longer holds."""
    text = README.read_text()
    result = text[text.index("## Result"):text.index("\n## ", text.index("## Result") + 1)]
    tables = [ROOT / link for link in re.findall(r"\]\((docs/benchmarks/methods/[^)#]+/README\.md)\)", result)]
    assert tables, "the Result links to no table under docs/benchmarks/methods/"
    held = "\n".join(t.read_text() for t in tables)
    numbers = re.findall(r"\d+\.\d+x?", result)
    assert numbers and [n for n in numbers if not re.search(rf"(?<![\d.]){re.escape(n)}(?!\d)", held)] == []


def test_56_make_demo_trains_the_products_method_with_flags_train_accelerate_accepts():
    """The demo shows `adaptive` (the README's picture), and its train_accelerate.py flags parse."""
    import train_accelerate

    recipe = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    flags = recipe.split("train_accelerate.py", 1)[1].split("\n\t@echo", 1)[0]
    flags = re.sub(r"\$\(if \$\(DATA\),[^,]*,([^)]*)\)", r"\1", flags).replace("\\\n", " ").replace("$$p", "no")
    flags = flags.replace("$(DEMO_DIR)", "runs/demo")
    args = train_accelerate.parse_args(shlex.split(flags))
    assert args.timestep_sampler == "adaptive" and args.preset == "cpu-tiny16"
