"""Every bad config a clean refusal, checked in-process (fast): one paragraph naming the problem and the fix,
a `UsageError` (exit 2 at every entry point) and never another exception, a hang or a file written.

The categories are the ones measured in issue 15: non-finite and out-of-range numbers, task options of the
wrong type or shape, uncatchable signal names, entrypoints that are not callable or take the wrong arguments,
run directories that cannot be one, binary or UTF-16 files, deep nesting, alias bombs, duplicate keys, huge
files and values, empty files. A few go through the real CLI in test_run_errors.py; a hypothesis fuzz test
over documents and `--set` values closes the gaps between the cases.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest
from conftest import MLP, TINY_GPT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from legato.config import Config, load_config
from legato.errors import UsageError

GOOD = TINY_GPT.read_text()
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)

# name -> (config text or None for the defaults, --set values, words the message must hold)
CASES: dict[str, tuple[str | None, list[str], tuple[str, ...]]] = {
    "nan_lr": (GOOD, ["train.lr=.nan"], ("train.lr", "finite")),
    "nan_lr_as_text": (GOOD, ["train.lr=nan"], ("train.lr", "finite")),
    "inf_lr": (GOOD, ["train.lr=.inf"], ("train.lr", "finite")),
    "overflowing_lr": (GOOD, ["train.lr=1e999"], ("train.lr", "finite")),
    "huge_lr": (GOOD, ["train.lr=1e9"], ("train.lr", "at most")),
    "negative_lr": (GOOD, ["train.lr=-0.1"], ("train.lr", "at least 0")),
    "nan_every_minutes": (GOOD, ["checkpoint.every_minutes=.nan"], ("checkpoint.every_minutes", "finite")),
    "nan_mem_gb": (GOOD, ["slurm.mem_gb=.nan"], ("slurm.mem_gb", "finite")),
    "inf_mem_gb": (GOOD, ["slurm.mem_gb=inf"], ("slurm.mem_gb", "finite")),
    "nan_preempt_every_s": (GOOD, ["chaos.preempt_every_s=.nan"], ("chaos.preempt_every_s", "finite")),
    "nan_command_timeout": (GOOD, ["repro.command_timeout_s=.nan"], ("repro.command_timeout_s", "finite")),
    "astronomic_steps": (GOOD, ["train.steps=1000000000000000000000000000000"], ("train.steps", "at most")),
    "thousand_digit_steps": (GOOD, ["train.steps=" + "9" * 1000], ("1000-digit number",)),
    "huge_timeout": (GOOD, ["train.collective_timeout_s=99999999999"], ("train.collective_timeout_s", "at most")),
    "too_many_local_tasks": (GOOD, ["local.tasks=100000"], ("local.tasks", "at most")),
    "unknown_parallel": (GOOD, ["train.parallel=fsdp"], ("train.parallel", "ddp, fsdp2")),
    "accumulate_not_dividing_batch": (GOOD, ["train.accumulate=3"], ("train.batch_size is 8", "train.accumulate (3)")),
    "amp_with_fsdp2": (GOOD, ["train.parallel=fsdp2", "train.amp=true"], ("train.amp", "train.fsdp2.param_dtype: bfloat16")),
    "fsdp2_dtype": (GOOD, ["train.fsdp2.param_dtype=float16"], ("train.fsdp2.param_dtype", "float32, bfloat16")),
    "negative_seed": (GOOD, ["determinism.seed=-1"], ("determinism.seed",)),
    "float_steps": (GOOD, ["train.steps=1.5"], ("train.steps", "an integer")),
    "bool_steps": (GOOD, ["train.steps=true"], ("train.steps", "an integer")),
    "option_wrong_type": (GOOD, ["train.options.dim=wide"], ("train.options.dim", "an integer")),
    "option_list": (GOOD, ["train.options.layers=[1, 2]"], ("train.options.layers", "an integer")),
    "option_float_for_int": (GOOD, ["train.options.dim=64.5"], ("train.options.dim", "an integer")),
    "option_out_of_range": (GOOD, ["train.options.dropout=1.5"], ("train.options.dropout", "from 0 to 0.99")),
    "option_nan": (GOOD, ["train.options.token_noise=.nan"], ("train.options.token_noise", "finite")),
    "options_not_a_mapping": (GOOD, ["train.options=5"], ("train.options", "a mapping")),
    "heads_do_not_divide_dim": (GOOD, ["train.options.heads=5"], ("train.options.heads is 5", "does not divide", "dim (64)")),
    "zero_heads": (GOOD, ["train.options.heads=0"], ("train.options.heads",)),
    "dataset_smaller_than_ranks": (GOOD, ["train.options.sentences=1", "train.options.block=64"], ("fewer than the 2 ranks",)),
    "mlp_samples_below_ranks": (None, ["train.task=mlp", "train.options.samples=1"], ("train.options.samples is 1", "2 ranks")),
    "mlp_too_big": (None, ["train.task=mlp", "train.options.samples=10000000", "train.options.features=100000"], ("in memory",)),
    "mlp_zero_mixup": (None, ["train.task=mlp", "train.options.mixup=0"], ("train.options.mixup",)),
    "signal_kill": (GOOD, ["slurm.signal=KILL"], ("slurm.signal", "cannot use")),
    "signal_stop": (GOOD, ["slurm.signal=SIGSTOP"], ("slurm.signal", "cannot use")),
    "signal_sig_ign": (GOOD, ["slurm.signal=SIG_IGN"], ("slurm.signal", "not a signal name")),
    "signal_segv": (GOOD, ["slurm.signal=SEGV"], ("slurm.signal", "cannot use")),
    "signal_number": (GOOD, ["slurm.signal=9"], ("slurm.signal", "a string")),
    "signal_rank_beyond_world": (GOOD, ["chaos.signal_rank=2"], ("chaos.signal_rank is 2", "2 ranks", "never fire")),
    "signal_rank_beyond_slurm_world": (
        None,
        ["executor=slurm", "slurm.tasks_per_node=4", "chaos.signal_rank=4", "chaos.signal_at_steps=[3]"],
        ("4 ranks",),
    ),
    "signal_step_negative": (GOOD, ["chaos.signal_at_steps=[-1]"], ("chaos.signal_at_steps", "from 0")),
    "unknown_rng": (GOOD, ["chaos.consume_rng_after_restore=[cuda]"], ("consume_rng_after_restore", "python, numpy and torch")),
    "entrypoint_with_spaces": (GOOD, ["train.entrypoint=my module:main"], ("package.module:function",)),
    "entrypoint_two_colons": (GOOD, ["train.entrypoint=a:b:c"], ("package.module:function",)),
    "run_dir_in_proc": (GOOD, ["run.dir=/proc/self/run"], ("run.dir", "kernel filesystem")),
    "run_dir_in_sys": (GOOD, ["run.dir=/sys/kernel/run"], ("run.dir", "kernel filesystem")),
    "run_dir_too_long": (GOOD, ["run.dir=/tmp/" + "d" * 300], ("run.dir", "longer than the OS allows")),
    "run_dir_path_too_long": (GOOD, ["run.dir=" + "/d" * 2100], ("run.dir", "longer than")),
    "run_dir_with_nul": (GOOD.replace("dir: runs/tiny_gpt", 'dir: "runs/a\\0b"'), [], ("run.dir", "NUL")),
    "run_name_huge": (GOOD, ["run.name=" + "n" * 1000], ("run.name", "1 to 200")),
    "run_name_newline": (GOOD.replace("name: tiny_gpt", 'name: "a\\nb"'), [], ("run.name",)),
    "run_name_dotdot": (GOOD, ["run.name=.."], ("run.name",)),
    "partition_with_shell": (GOOD, ["slurm.partition=gpu; rm -rf ~"], ("slurm.partition", "letters, digits")),
    "sbatch_value_newline": (
        GOOD.replace("executor: local", 'executor: local\nslurm:\n  extra_sbatch: {comment: "a\\n#SBATCH --x"}'),
        [],
        ("slurm.extra_sbatch.comment", "one line"),
    ),
    "sbatch_option_odd": (GOOD.replace("executor: local", 'executor: local\nslurm:\n  extra_sbatch: {"x y": 1}'), [], ("extra_sbatch",)),
    "list_too_long": (GOOD, ["chaos.signal_at_steps=[" + ", ".join(["1"] * 10_001) + "]"], ("chaos.signal_at_steps", "10000")),
    "duplicate_key": (GOOD.replace("  steps: 60\n", "  steps: 60\n  steps: 70\n"), [], ("appears twice", "steps")),
    "duplicate_section": (GOOD + "train:\n  steps: 5\n", [], ("appears twice", "train")),
    "alias_bomb_in_options": (
        "train:\n  options:\n" + "".join("    " + line + "\n" for line in LAUGHS.splitlines()),
        [],
        ("billion laughs",),
    ),
    "alias_bomb_top_level": (LAUGHS, [], ("billion laughs",)),
    "alias_bomb_in_set": (
        GOOD,
        ["train.options={" + LAUGHS.replace("\n", ", ").rstrip(", ").replace(": &", ": &") + "}"],
        ("billion laughs",),
    ),
    "deep_nesting": ("train:\n  options:\n    x: " + "[" * 5000 + "]" * 5000 + "\n", [], ("nests deeper",)),
    "deep_nesting_in_set": (GOOD, ["train.options.x=" + "[" * 5000 + "]" * 5000], ("nests deeper",)),
    "python_tag": (
        "run: !!python/object/apply:os.system ['touch /tmp/legato-pwned']\n",
        [],
        ("the tag !!python/object/apply:os.system", "Remove the tag"),
    ),
    "list_document": ("- run\n- train\n", [], ("mapping of sections",)),
    "scalar_document": ("just text\n", [], ("mapping of sections",)),
    "empty_file": ("", [], ("is empty",)),
    "comments_only": ("# nothing here\n\n# at all\n", [], ("is empty",)),
    "empty_document": ("---\n...\n", [], ("empty document",)),
    "non_string_key": ("1: 2\n", [], ("mapping key that is an integer", "line 1", "Quote the key")),
    "list_as_key": ("? [a, b]\n: 1\n", [], ("not valid YAML",)),
    "bad_set_key": (GOOD, ["train..steps=3"], ("--set", "dotted key")),
    "set_without_key": (GOOD, ["=3"], ("key=value",)),
    "set_with_nul": (GOOD, ["run.name=a\x00b"], ("NUL",)),
    "set_too_long": (GOOD, ["run.name=" + "n" * 70_000], ("longer than",)),
    "set_invalid_yaml": (GOOD, ["train.steps=[1"], ("not valid YAML",)),
    # issue 25: YAML beyond the core schema, text that is not one line, paths, missing keys, options no rank could train
    "date_in_options": (GOOD, ["train.options.started=2024-01-01"], ("train.options.started", "date or time", "Quote it")),
    "datetime_in_file": (GOOD.replace("  lr: 0.003\n", "  lr: 2001-12-14t21:59:43.10-05:00\n"), [], ("date or time", "line 12")),
    "date_as_key": (GOOD, ["train.options={2024-01-01: x}"], ("date or time",)),
    "binary_tag": (GOOD.replace("    dropout: 0.1\n", "    dropout: 0.1\n    blob: !!binary aGVsbG8=\n"), [], ("binary data (!!binary)",)),
    "set_tag": (GOOD, ["train.options.tags=!!set {a, b}"], ("a set (!!set)", "Write a list instead")),
    "omap_tag": (GOOD, ["train.options.order=!!omap [a: 1, b: 2]"], ("an ordered map (!!omap)", "Write a mapping")),
    "pairs_tag": (GOOD, ["train.options.order=!!pairs [a: 1]"], ("a list of pairs (!!pairs)",)),
    "custom_tag": (GOOD, ["train.options.x=!vault abc"], ("the tag !vault", "Remove the tag")),
    "python_tuple_tag": (GOOD, ["train.options.x=!!python/tuple [1, 2]"], ("the tag !!python/tuple",)),
    "mixed_keys": (GOOD, ["train.options.table={1: a, b: c}"], ("mapping key that is an integer", "Quote the key")),
    "bool_key": (GOOD.replace("    dropout: 0.1\n", "    dropout: 0.1\n    on: 1\n"), [], ("mapping key that is true/false",)),
    "run_dir_dotdot": (GOOD, ["run.dir=runs/../../elsewhere"], ("run.dir", "'..' component")),
    "run_dir_tilde": (GOOD, ["run.dir=~/runs/x"], ("run.dir", "starts with '~'", "Write the full path")),
    "run_dir_blank": (GOOD, ["run.dir='runs/x '"], ("run.dir", "ends with a blank")),
    "run_name_slash": (GOOD, ["run.name=team/x"], ("run.name", "cannot hold '/'")),
    "run_name_blank": (GOOD, ["run.name=' x'"], ("run.name", "begins or ends with a blank")),
    "run_name_crlf": (GOOD.replace("name: tiny_gpt", 'name: "tiny\\r\\ngpt"'), [], ("run.name", "carriage return", "character 5")),
    "run_name_tab": (GOOD.replace("name: tiny_gpt", 'name: "tiny\\tgpt"'), [], ("run.name", "a tab")),
    "run_name_line_separator": (GOOD.replace("name: tiny_gpt", 'name: "tiny\\u2028gpt"'), [], ("run.name", "U+2028")),
    "setup_line_crlf": (GOOD, ['slurm.setup=["module load x\\r"]'], ("slurm.setup", "carriage return")),
    "repro_allow_del": (GOOD, ['repro.allow=["A\\x7f"]'], ("repro.allow", "U+007F")),
    "master_addr_newline": (GOOD, ['slurm.master_addr="node1\\nnode2"'], ("slurm.master_addr", "line break")),
    "cr_in_set_value": (GOOD, ["train.options.note=a\rb"], ("--set 'train.options.note'", "carriage return")),
    "cr_in_options_text": (GOOD, ['train.options.note="a\\r\\nb"'], ("train.options.note", "carriage return")),
    "control_in_options_key": (GOOD, ['train.options={"a\\x01": 1}'], ("train.options has a key",)),
    "nan_in_options": (GOOD, ["train.options.clip=.nan"], ("train.options.clip", "finite")),
    "inf_nested_in_options": (GOOD, ["train.options.sched={warm: [1, {peak: -.inf}]}"], ("train.options.sched.warm[1].peak", "finite")),
    "sbatch_value_tab": (GOOD, ['slurm.extra_sbatch={comment: "a\\tb"}'], ("slurm.extra_sbatch.comment", "a tab")),
    "missing_steps": (GOOD.replace("  steps: 60\n", ""), [], ("train.steps is missing", "--set train.steps=")),
    "missing_task": (GOOD.replace("  task: tiny_gpt\n", ""), [], ("train.task (or train.entrypoint) is missing",)),
    "missing_run_name_and_dir": (
        GOOD.replace("  name: tiny_gpt\n  dir: runs/tiny_gpt\n", "  {}\n").replace("run:\n  {}", "run: {}"),
        [],
        ("run.name (or run.dir) is missing",),
    ),
    "missing_train_section": ("run: {name: x}\n", [], ("train.steps is missing",)),
    "steps_null": (GOOD, ["train.steps=null"], ("train.steps must be an integer",)),
    "near_miss_option": (GOOD, ["train.options.head=4"], ("train.options.head", "Did you mean train.options.heads?")),
    "mlp_batch_of_one": (MLP.read_text(), ["train.batch_size=1"], ("train.batch_size is 1", "batch norm")),
    "mlp_batch_beyond_share": (MLP.read_text(), ["train.options.samples=20"], ("train.options.samples is 20", "no full batch")),
    "gpt_batch_beyond_windows": (GOOD, ["train.options.sentences=100", "train.batch_size=200"], ("fewer than the 2 ranks times",)),
    "gpt_largest_corpus_too_few_windows": (
        GOOD,
        ["train.options={sentences: 200000, block: 2, dim: 4, heads: 1, layers: 1}", "train.batch_size=1000000"],
        ("give at most", "fewer than the 2 ranks times"),
    ),
    "gpt_beyond_memory": (GOOD, ["train.options.dim=4096", "train.options.layers=64"], ("GiB on each rank", "Lower dim")),
    "mlp_beyond_memory": (MLP.read_text(), ["train.options.hidden=100000", "train.options.features=100000"], ("GiB on each rank",)),
}

# name -> file bytes (written as-is), words
FILES: dict[str, tuple[bytes, tuple[str, ...]]] = {
    "binary": (bytes(range(256)) * 4, ("binary or UTF-16",)),
    "utf16": (GOOD.encode("utf-16"), ("binary or UTF-16",)),
    "latin1": ("run:\n  name: caf\u00e9\n".encode("latin-1"), ("not UTF-8",)),
    "over_size_limit": (b"# " + b"x" * (300 * 1024) + b"\n", ("larger than 256 KiB",)),
    "ten_mb_run_name": (b"run:\n  name: " + b"n" * (10 * 1024 * 1024) + b"\n", ("larger than 256 KiB",)),
}


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(path: Path | None, sets: list[str]) -> str:
    with pytest.raises(UsageError) as info:
        load_config(path, sets)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert len(message) < 1200, message[:300]
    return message


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_config_is_one_paragraph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.chdir(tmp_path)
    text, sets, words = CASES[name]
    path = None
    if text is not None:
        path = tmp_path / "config.yaml"
        path.write_text(text)
    before = tree_digest(tmp_path)
    message = refused(path, sets)
    for word in words:
        assert word in message, message
    assert tree_digest(tmp_path) == before
    assert not Path("/tmp/legato-pwned").exists()


@pytest.mark.parametrize("name", sorted(FILES))
def test_bad_config_file_is_one_paragraph(tmp_path: Path, name: str) -> None:
    data, words = FILES[name]
    path = tmp_path / "config.yaml"
    path.write_bytes(data)
    message = refused(path, [])
    for word in words:
        assert word in message, message


def test_a_200_mb_file_is_refused_by_its_size_without_being_read(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with open(path, "wb") as f:
        f.truncate(200 * 1024 * 1024)  # sparse: 200 MB long, nothing on disk
    assert "larger than 256 KiB" in refused(path, [])


@pytest.mark.parametrize("special", ["directory", "fifo", "/dev/zero"])
def test_a_config_that_is_not_a_regular_file_is_refused_without_opening_it(tmp_path: Path, special: str) -> None:
    if special == "directory":
        path = tmp_path
    elif special == "fifo":
        path = tmp_path / "pipe.yaml"
        os.mkfifo(path)  # opening it would block forever
    else:
        path = Path(special)
    assert "not a regular file" in refused(path, [])


def test_run_dir_that_is_a_file_or_under_a_file(tmp_path: Path) -> None:
    afile = tmp_path / "taken"
    afile.write_text("precious")
    assert "is a file, not a directory" in refused(None, [f"run.dir={afile}"])
    assert f"lies under {afile}, which is a file" in refused(None, [f"run.dir={afile}/run"])
    assert afile.read_text() == "precious"


def test_run_dir_under_a_read_only_directory(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere: the permission check cannot fail here")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert "not writable" in refused(None, [f"run.dir={locked}/run"])


ENTRYPOINTS = {
    "not_callable": ("main = 42\n", ("is a int, not a function",)),
    "no_arguments": ("def main():\n    return 0\n", ("cannot be called with one argument", "()")),
    "two_arguments": ("def main(ctx, other):\n    return 0\n", ("cannot be called with one argument", "(ctx, other)")),
    "keyword_only": ("def main(*, ctx):\n    return 0\n", ("cannot be called with one argument",)),
    "missing_function": ("def other(ctx):\n    return 0\n", ("has no function 'main'",)),
    "broken_module": ("raise RuntimeError('half-written file')\n", ("RuntimeError: half-written file", "imports cleanly")),
    "syntax_error": ("def main(ctx)\n    return 0\n", ("SyntaxError",)),
}


@pytest.mark.parametrize("name", sorted(ENTRYPOINTS))
def test_entrypoint_is_checked_for_importability_and_signature(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    from legato.runtime.entrypoint import resolve_entrypoint

    source, words = ENTRYPOINTS[name]
    module = f"legato_ep_{name}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, [f"train.entrypoint={module}:main", f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(UsageError) as info:
        resolve_entrypoint(cfg)
    sys.modules.pop(module, None)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_a_good_entrypoint_and_good_configs_still_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from legato.runtime.entrypoint import resolve_entrypoint

    (tmp_path / "legato_ep_good.py").write_text("def main(ctx, extra=None):\n    return 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, ["train.entrypoint=legato_ep_good:main", f"run.dir={tmp_path / 'run'}"])
    assert resolve_entrypoint(cfg).__name__ == "main"
    for config in sorted(TINY_GPT.parent.glob("*.yaml")):
        assert isinstance(load_config(config), Config)
    # Anchors, aliases and merge keys within the limits stay legal YAML.
    path = tmp_path / "anchored.yaml"
    path.write_text(
        f"run: {{name: anchored, dir: {tmp_path}/a}}\ntrain:\n  <<: {{steps: 7}}\n  task: mlp\n  warmup_steps: &n 3\n"
        "checkpoint:\n  every_steps: *n\n"
    )
    cfg = load_config(path)
    assert (cfg.train.steps, cfg.train.warmup_steps, cfg.checkpoint.every_steps) == (7, 3, 3)
    assert load_config(None, ["train.lr=1e-3", "slurm.signal=sigusr1", f"run.dir={tmp_path}/r"]).slurm.signal == "USR1"


# -- fuzz --------------------------------------------------------------------------------

KEYS = [
    "run",
    "train",
    "slurm",
    "local",
    "chaos",
    "checkpoint",
    "determinism",
    "repro",
    "executor",
    "name",
    "dir",
    "steps",
    "lr",
    "options",
    "heads",
    "dim",
    "signal",
    "signal_rank",
    "mem_gb",
    "every_minutes",
    "preempt_every_s",
    "entrypoint",
    "task",
    "tasks",
    "nodes",
    "seed",
    "allow",
    "setup",
    "extra_sbatch",
    "x",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["KILL", "USR2", ".nan", "-.inf", "tiny_gpt", "mlp", "/proc/x", "a:b", "1e999", "&a", "*a"]),
)


def _nested(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)


DOCS = st.recursive(SCALARS, _nested, max_leaves=30)
SETS = st.lists(
    st.builds(lambda k, v: f"{k}={v}", st.lists(st.sampled_from(KEYS), min_size=1, max_size=3).map(".".join), st.text(max_size=30)),
    max_size=3,
)


def _loads_or_refuses(path: Path | None, sets: list[str]) -> None:
    try:
        cfg = load_config(path, sets)
    except UsageError as exc:
        message = str(exc)
        assert message and "\n" not in message and len(message) < 1200, message[:300]
        return
    assert isinstance(cfg, Config)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=DOCS, sets=SETS)
def test_fuzz_structured_documents_and_sets(tmp_path: Path, doc: object, sets: list[str]) -> None:
    import yaml

    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc))
    before = tree_digest(tmp_path)
    _loads_or_refuses(path, sets)
    assert tree_digest(tmp_path) == before


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(text=st.text(alphabet=st.sampled_from(list("abrun:tesp-[]{}&*!|>'\"#\n 019.,?<%@`\\\t")), max_size=200))
def test_fuzz_raw_yaml_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text)
    _loads_or_refuses(path, [])
    _loads_or_refuses(None, [f"train.options.x={text}"])


def test_what_the_schema_still_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusals of issue 25 leave sensible input alone: each of these loads, some normalized."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(GOOD.replace("\n", "\r\n"))  # a file saved with Windows line ends is still one config
    assert load_config(path).run.name == "tiny_gpt"
    cfg = load_config(
        path,
        [
            "run.dir=runs//x/./y/",
            'train.options.started="2024-01-01"',
            "train.options.op==",
            'train.options.pem="-----BEGIN KEY-----\\nabc\\tdef\\n-----END KEY-----"',
            "train.options.nested={a: [1, 2.5, null]}",
        ],
    )
    assert cfg.run.dir == "runs/x/y"
    assert cfg.train.options["started"] == "2024-01-01" and cfg.train.options["op"] == "="
    assert cfg.train.options["pem"] == "-----BEGIN KEY-----\nabc\tdef\n-----END KEY-----"  # text a task reads may span lines
    path.write_text(GOOD.replace("  steps: 60\n", "").replace("  task: tiny_gpt\n", ""))
    cfg = load_config(path, ["train.steps=5", "train.entrypoint=pkg.mod:main"])  # a --set says what the file left out
    assert (cfg.train.steps, cfg.train.entrypoint) == (5, "pkg.mod:main")
    assert load_config(None).train.steps == 60  # the programmatic defaults are still defaults
