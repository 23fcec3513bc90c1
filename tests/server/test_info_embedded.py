"""/info of the embedded model (its Q4_1/Q8_0 GGUF): which numerics and which kernels run."""

from __future__ import annotations

from tests import http
from tests.kernels.test_q8 import widest_q8_path
from tests.server.conftest import Server


def test_info_names_the_numerics_and_the_cpus_q8_kernels(smol_server: Server) -> None:
    info = http.get(smol_server.url + "/info").json()
    assert info["model_weight_blocks"] == ["Q4_1", "Q8_0"]
    assert info["model_numerics"] == "q8"  # the default for a GGUF
    assert info["model_q8_kernels"] == widest_q8_path()  # vnni where the CPU has AVX512-VNNI
    # read in place: the file's bytes by type, everything quantised runs as blocks
    weights = info["model_weights"]
    assert set(weights["bytes_by_type"]) == {"Q4_1", "Q8_0", "F32"}
    assert weights["block_tensors"] == 211 and weights["expanded_types"] == {}
    assert info["model_native_refusal"] is None  # its layers run in one native call
