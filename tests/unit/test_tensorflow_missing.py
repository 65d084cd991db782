"""Without TensorFlow, importing hvd_lite.tensorflow or hvd_lite.keras says what to install."""

import subprocess
import sys

import pytest

BLOCK = "import sys; sys.modules['tensorflow'] = None; sys.modules['keras'] = None; "


@pytest.mark.parametrize("module", ["hvd_lite.tensorflow", "hvd_lite.keras"])
def test_import_without_tensorflow_names_the_extra(module):
    res = subprocess.run(
        [sys.executable, "-c", BLOCK + f"import {module}"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode != 0
    assert "pip install 'hvd_lite[tensorflow]'" in res.stderr, res.stderr
