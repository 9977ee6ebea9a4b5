"""runtime.allocator.tune: glibc's malloc thresholds raised once per process, the user's environment respected."""

import platform

import pytest

from eaglespec.runtime import allocator


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(allocator, "_done", [])
    for name in allocator._ENV:
        monkeypatch.delenv(name, raising=False)


glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="glibc's malloc only")


@glibc
def test_tune_sets_the_thresholds_once(fresh, monkeypatch):
    calls = []
    real = allocator._tune
    monkeypatch.setattr(allocator, "_tune", lambda *a: calls.append(a) or real(*a))
    assert allocator.tune() == "tuned"
    assert allocator.tune(1, 1) == "tuned" and calls == [(allocator.MMAP_THRESHOLD, allocator.TRIM_THRESHOLD)]


@glibc
def test_the_environment_s_settings_stand(fresh, monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    assert allocator.tune() == "set by the environment (MALLOC_TRIM_THRESHOLD_): left as it is"


def test_other_systems_are_left_alone(fresh, monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    assert allocator.tune().startswith("not glibc (Darwin")


def test_bad_thresholds_are_refused(fresh):
    with pytest.raises(ValueError, match="thresholds must be positive"):
        allocator.tune(0, allocator.TRIM_THRESHOLD)


def test_the_commands_tune_it_before_loading(monkeypatch, tmp_path):
    from eaglespec import cli

    calls = []
    monkeypatch.setattr(allocator, "tune", lambda: calls.append(1) or "tuned")
    with pytest.raises(SystemExit):
        cli.main(["generate", "--model", str(tmp_path / "missing"), "--prompt", "hi"])
    assert calls == [1]
