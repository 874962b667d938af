"""Tests for redrive.config: the built-in layout, its env overrides and TOML config files."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from redrive.config import (
    DEFAULT_DLQ_RETENTION_SECONDS,
    DEFAULT_MAX_RECEIVE_COUNT,
    Family,
    Layout,
    built_in_layout,
    load_layout,
    parse_config,
    parse_config_file,
)
from redrive.errors import ConfigError

ATLAS = """\
[defaults]
region = "eu-west-1"
max_receive_count = 8
dlq_retention = "14d"

[families.atlas-prod-default]
queue = "atlas-prod-default"
dlq = "atlas-prod-default-dlq"
priority = 2

[families.atlas-prod-notify]
queue = "https://sqs.eu-west-1.amazonaws.com/123456789012/atlas-prod-notify"
dlq = "atlas-prod-notify-dead"
priority = 1
max_receive_count = 3
dlq_retention = 345600

[families.atlas-prod-export]
queue = "atlas-prod-export"
region = "us-west-2"
priority = 3
dlq_retention = "7d"
"""


def write(tmp_path: Path, text: str, name: str = "redrive.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# -- the built-in layout ---------------------------------------------------------------


def test_built_in_layout_has_the_three_onion_families_in_priority_order() -> None:
    layout = built_in_layout({})
    assert layout.source == "built-in"
    assert layout.prefix == "onion"
    assert [(f.name, f.queue, f.priority) for f in layout.families] == [
        ("checkout", "onion-checkout", 1),
        ("default", "onion", 2),
        ("progress", "onion-progress", 3),
    ]
    for family in layout.families:
        # No explicit DLQ: it comes from the source queue's RedrivePolicy.
        assert family.dlq is None
        assert family.region is None
        assert family.max_receive_count == DEFAULT_MAX_RECEIVE_COUNT == 5
        assert family.dlq_retention_seconds == DEFAULT_DLQ_RETENTION_SECONDS == 14 * 86400


def test_layout_family_lookup() -> None:
    layout = built_in_layout({})
    assert layout.family("default") == Family("default", "onion", priority=2)
    assert layout.family("onion") is None  # a queue name is not a family name
    assert layout.family("Checkout") is None


@pytest.mark.parametrize(
    ("var", "family", "value"),
    [
        ("CELERY_CHECKOUT_QUEUE", "checkout", "staging-checkout"),
        ("CELERY_DEFAULT_QUEUE", "default", "staging"),
        ("CELERY_PROGRESS_QUEUE", "progress", "staging-progress"),
        (
            "CELERY_DEFAULT_QUEUE",
            "default",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/staging",
        ),
    ],
)
def test_env_overrides_one_family_queue(var: str, family: str, value: str) -> None:
    layout = built_in_layout({var: value})
    assert layout.family(family) is not None
    assert layout.family(family).queue == value  # type: ignore[union-attr]
    others = {f.name: f.queue for f in layout.families if f.name != family}
    defaults = {"checkout": "onion-checkout", "default": "onion", "progress": "onion-progress"}
    assert others == {k: v for k, v in defaults.items() if k != family}


def test_empty_env_override_keeps_the_default_queue() -> None:
    layout = built_in_layout({"CELERY_CHECKOUT_QUEUE": ""})
    assert layout.family("checkout").queue == "onion-checkout"  # type: ignore[union-attr]


def test_load_layout_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_PROGRESS_QUEUE", "other-progress")
    layout = load_layout(None)
    assert layout.source == "built-in"
    assert layout.family("progress").queue == "other-progress"  # type: ignore[union-attr]


# -- choosing the config file ----------------------------------------------------------


def test_redrive_config_env_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, ATLAS)
    layout = load_layout(None, {"REDRIVE_CONFIG": str(path)})
    assert layout.source == str(path)
    assert [f.name for f in layout.families] == [
        "atlas-prod-notify",
        "atlas-prod-default",
        "atlas-prod-export",
    ]


def test_explicit_path_wins_over_redrive_config(tmp_path: Path) -> None:
    explicit = write(tmp_path, '[families.one]\nqueue = "one"\n', "explicit.toml")
    from_env = write(tmp_path, ATLAS, "env.toml")
    layout = load_layout(str(explicit), {"REDRIVE_CONFIG": str(from_env)})
    assert layout.source == str(explicit)
    assert [f.name for f in layout.families] == ["one"]


def test_redrive_config_from_process_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, ATLAS)
    monkeypatch.setenv("REDRIVE_CONFIG", str(path))
    assert load_layout(None).source == str(path)


def test_config_file_ignores_celery_queue_overrides(tmp_path: Path) -> None:
    # The env overrides belong to the built-in layout only; a file says what it means.
    path = write(tmp_path, ATLAS)
    layout = load_layout(str(path), {"CELERY_DEFAULT_QUEUE": "elsewhere"})
    assert "elsewhere" not in {f.queue for f in layout.families}


def test_empty_redrive_config_means_built_in() -> None:
    assert load_layout(None, {"REDRIVE_CONFIG": ""}).source == "built-in"


# -- a TOML layout ---------------------------------------------------------------------


def test_atlas_layout(tmp_path: Path) -> None:
    layout = parse_config_file(write(tmp_path, ATLAS))
    assert isinstance(layout, Layout)
    notify, default, export = layout.families
    assert default == Family(
        name="atlas-prod-default",
        queue="atlas-prod-default",
        dlq="atlas-prod-default-dlq",
        region="eu-west-1",  # from [defaults]
        priority=2,
        max_receive_count=8,  # from [defaults]
        dlq_retention_seconds=14 * 86400,  # "14d" from [defaults]
    )
    assert notify == Family(
        name="atlas-prod-notify",
        queue="https://sqs.eu-west-1.amazonaws.com/123456789012/atlas-prod-notify",
        dlq="atlas-prod-notify-dead",
        region="eu-west-1",
        priority=1,
        max_receive_count=3,
        dlq_retention_seconds=345600,
    )
    assert export == Family(
        name="atlas-prod-export",
        queue="atlas-prod-export",
        dlq=None,
        region="us-west-2",  # its own region wins over [defaults]
        priority=3,
        max_receive_count=8,
        dlq_retention_seconds=7 * 86400,
    )
    assert layout.prefix is None


def test_families_without_priority_keep_file_order(tmp_path: Path) -> None:
    text = """\
        [defaults]
        prefix = "atlas"

        [families.zeta]
        queue = "zeta"

        [families.alpha]
        queue = "alpha"
    """
    layout = parse_config_file(write(tmp_path, text))
    assert [(f.name, f.priority) for f in layout.families] == [("zeta", 1), ("alpha", 2)]
    assert layout.prefix == "atlas"
    assert all(f.dlq_retention_seconds == DEFAULT_DLQ_RETENTION_SECONDS for f in layout.families)
    assert all(f.max_receive_count == DEFAULT_MAX_RECEIVE_COUNT for f in layout.families)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [('"14d"', 14 * 86400), ('"36h"', 36 * 3600), ('"90m"', 5400), ("600", 600), ('"60"', 60)],
)
def test_dlq_retention_forms(tmp_path: Path, value: str, seconds: int) -> None:
    text = f'[families.x]\nqueue = "x"\ndlq_retention = {value}\n'
    layout = parse_config_file(write(tmp_path, text))
    assert layout.families[0].dlq_retention_seconds == seconds


# -- broken configs: always a ConfigError naming the file and the key -------------------


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_layout(str(path), {})
    assert str(path) in str(info.value)


def test_missing_file_from_redrive_config(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match="REDRIVE_CONFIG") as info:
        load_layout(None, {"REDRIVE_CONFIG": str(path)})
    assert str(path) in str(info.value)


def test_directory_is_not_readable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read") as info:
        parse_config_file(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_bad_toml_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, '[families.x]\nqueue = "x\n')
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        parse_config_file(path)
    assert str(path) in str(info.value)
    assert "line 2" in str(info.value)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[families.x]\nqueue = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="cannot be read") as info:
        parse_config_file(path)
    assert str(path) in str(info.value)


BROKEN: list[tuple[str, str, str]] = [
    # (TOML, key the error must name, what it says)
    ('[family.x]\nqueue = "x"\n', "'family'", "unknown key"),
    ("", "families", "no [families.NAME]"),
    ("[families]\n", "families", "no [families.NAME]"),
    ('families = "onion"\n', "'families'", "must be a table"),
    ('[[families]]\nqueue = "x"\n', "'families'", "must be a table"),
    ('defaults = 3\n[families.x]\nqueue = "x"\n', "'defaults'", "must be a table"),
    ('[families]\nx = "onion"\n', "'families.x'", "must be a table"),
    ("[families.x]\ndlq = 'x-dlq'\n", "'families.x.queue'", "queue name or URL"),
    ("[families.x]\nqueue = ''\n", "'families.x.queue'", "queue name or URL"),
    ("[families.x]\nqueue = 7\n", "'families.x.queue'", "queue name or URL"),
    ("[families.x]\nqueue = 'x'\nqeue = 'y'\n", "'families.x.qeue'", "unknown key"),
    ("[families.x]\nqueue = 'x'\ndlq = 5\n", "'families.x.dlq'", "non-empty string"),
    ("[families.x]\nqueue = 'x'\ndlq = ''\n", "'families.x.dlq'", "non-empty string"),
    ("[families.x]\nqueue = 'x'\nregion = ['a']\n", "'families.x.region'", "non-empty string"),
    ("[families.x]\nqueue = 'x'\npriority = 'high'\n", "'families.x.priority'", "whole number"),
    ("[families.x]\nqueue = 'x'\npriority = -1\n", "'families.x.priority'", "whole number"),
    ("[families.x]\nqueue = 'x'\npriority = 1.5\n", "'families.x.priority'", "whole number"),
    (
        "[families.x]\nqueue = 'x'\nmax_receive_count = true\n",
        "'families.x.max_receive_count'",
        "whole number",
    ),
    (
        "[families.x]\nqueue = 'x'\ndlq_retention = 'forever'\n",
        "'families.x.dlq_retention'",
        "duration",
    ),
    ("[families.x]\nqueue = 'x'\ndlq_retention = 0\n", "'families.x.dlq_retention'", "duration"),
    (
        "[families.x]\nqueue = 'x'\ndlq_retention = 1.5\n",
        "'families.x.dlq_retention'",
        "duration",
    ),
    ("[defaults]\nregoin = 'x'\n[families.x]\nqueue = 'x'\n", "'defaults.regoin'", "unknown key"),
    (
        "[defaults]\nmax_receive_count = 'five'\n[families.x]\nqueue = 'x'\n",
        "'defaults.max_receive_count'",
        "whole number",
    ),
    ("[defaults]\nprefix = 1\n[families.x]\nqueue = 'x'\n", "'defaults.prefix'", "non-empty"),
    (
        "[defaults]\nregion = 1\n[families.x]\nqueue = 'x'\n",
        "'defaults.region'",
        "non-empty string",
    ),
]


@pytest.mark.parametrize(("text", "key", "says"), BROKEN)
def test_broken_config_names_file_and_key(tmp_path: Path, text: str, key: str, says: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        parse_config_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}:"), message
    assert key in message, message
    assert says in message, message


def test_bad_default_retention_names_the_defaults_key(tmp_path: Path) -> None:
    # The bad value is in [defaults]: pointing at a families.* key the file does not have
    # would send the operator looking in the wrong place.
    path = write(tmp_path, "[defaults]\ndlq_retention = 'soon'\n[families.x]\nqueue = 'x'\n")
    with pytest.raises(ConfigError) as info:
        parse_config_file(path)
    assert "'defaults.dlq_retention'" in str(info.value)


def test_bad_default_region_is_reported_even_when_every_family_sets_its_own(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "[defaults]\nregion = 5\n[families.x]\nqueue = 'x'\nregion = 'a'\n")
    with pytest.raises(ConfigError, match=r"'defaults\.region'"):
        parse_config_file(path)


def test_parse_config_uses_the_given_source_in_errors() -> None:
    data: dict[str, Any] = {"families": {"x": {"queue": 1}}}
    with pytest.raises(ConfigError, match=r"^inline: key 'families.x.queue'"):
        parse_config(data, "inline")
