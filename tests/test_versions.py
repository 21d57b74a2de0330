"""Supported framework versions: the range check, and that this environment is inside it."""

from __future__ import annotations

import importlib.metadata

import pytest

from eqdsl.runtime import versions


@pytest.mark.parametrize("version, inside", [
    ("2.11.0", True), ("2.11.0+cu130", True), ("2.13.0+cpu", True), ("2.10.2", False), ("2.14.0", False),
    ("2.14.0rc1", False), ("3.0", False),
])
def test_torch_range(version, inside):
    assert versions.in_range(version, *versions.SUPPORTED["torch"]) is inside


def test_jax_range_excludes_the_deprecated_lowering_releases():
    low, high = versions.SUPPORTED["jax"]
    assert versions.in_range("0.10.2", low, high) and versions.in_range("0.11.2", low, high)
    assert not versions.in_range("0.10.1", low, high) and not versions.in_range("0.12.0", low, high)


def test_installed_versions_are_supported():
    versions.check(*versions.SUPPORTED)


def test_out_of_range_names_package_version_and_range(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.9.9")
    with pytest.raises(ImportError, match=r"eqdsl supports torch >= 2.11, < 2.14; 9.9.9 is installed"):
        versions.check("torch")
