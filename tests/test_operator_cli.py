"""The operator's command lines refuse abbreviated flags (argparse's allow_abbrev)."""

from __future__ import annotations

import pytest

from octavo_operator import generate
from octavo_operator.main import build_parser


@pytest.mark.parametrize(
    "argv",
    [
        ["--namesp=team-a"],
        ["run", "--default-im=evil:1"],
        ["selfcheck", "--operator-url", "http://x/healthz", "--time=1"],
    ],
)
def test_operator_refuses_abbreviations(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_operator_full_flags_still_parse() -> None:
    args = build_parser().parse_args(["run", "--namespace", "team-a", "--default-image", "i:1"])
    assert (args.namespace, args.default_image) == (["team-a"], "i:1")


def test_generate_refuses_an_abbreviated_check(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        generate.main(["--che"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --che" in capsys.readouterr().err
