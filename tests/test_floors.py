import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
import oldest_versions as floors_script  # noqa: E402


def test_the_floors_are_the_lower_bounds_of_the_pinned_ranges(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        "[project]\ndependencies = [\n"
        '    "torch>=2.6,<2.15",\n    "trl>=1.16,<2",\n    "transformers<6,>=5.20",\n'
        '    "accelerate>=1.10,<2",\n    "peft>=0.18,<1",\n    "datasets>=4,<6",\n    "gymnasium>=1.3,<2",\n]\n'
        '[project.optional-dependencies]\ntest = ["peft>=0.1"]\n'
    )
    assert floors_script.floors(pyproject) == {
        "trl": "1.16",
        "transformers": "5.20",
        "accelerate": "1.10",
        "peft": "0.18",
        "datasets": "4",
        "gymnasium": "1.3",
    }


def test_a_library_without_a_floor_is_named(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = [\n    "trl>=1.16,<2",\n    "transformers",\n]\n')
    with pytest.raises(SystemExit, match="transformers"):
        floors_script.floors(pyproject)


def test_the_project_pins_a_floor_for_each_library_it_checks():
    assert set(floors_script.floors()) == set(floors_script.LIBRARIES)
