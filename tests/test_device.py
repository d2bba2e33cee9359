"""The chip table: one row per chip, peak numbers from JAX's own table, and deviceless topologies
that libtpu knows."""

from __future__ import annotations

import pytest

from stlib import device


def test_chip_table_rows():
    assert device.CHIPS == ("v5e", "v6e", "tpu7x")
    v5e, v6e, tpu7x = (device.chip_spec(c) for c in device.CHIPS)
    # the numbers of REFERENCE.md section 5, as JAX's table gives them (per device)
    assert (v5e.bf16_flops, v6e.bf16_flops, tpu7x.bf16_flops) == (197e12, 920e12, 1155e12)
    assert (v5e.hbm_bandwidth, v6e.hbm_bandwidth, tpu7x.hbm_bandwidth) == (0.82e12, 1.64e12, 3.7e12)
    assert (v5e.vmem_bytes, v6e.vmem_bytes, tpu7x.vmem_bytes) == (128 << 20, 128 << 20, 64 << 20)
    assert {c.smem_bytes for c in (v5e, v6e, tpu7x)} == {1 << 20}
    assert [(c.num_mxus, c.mxu_width) for c in (v5e, v6e, tpu7x)] == [(4, 128), (2, 256), (2, 256)]
    assert tpu7x.devices_per_chip == 2 and tpu7x.topology == "tpu7x:2x2x1"
    assert all(c.scoped_vmem_default < c.vmem_bytes for c in (v5e, v6e, tpu7x))
    with pytest.raises(ValueError, match="chip='v9'"):
        device.chip_spec("v9")


@pytest.mark.tpu_compile
@pytest.mark.parametrize("chip", device.CHIPS)
def test_deviceless_topology_has_the_chip_device_kind(chip):
    assert device.tpu_device(chip).device_kind.lower() in device.chip_spec(chip).device_kinds


def test_off_a_tpu_there_is_no_current_chip():
    assert device.current_chip() is None
    assert (
        device.chip_of_device_kind("TPU v6 lite") == "v6e" and device.chip_of_device_kind("TPU7x") == "tpu7x"
    )
    assert device.chip_of_device_kind("cpu") is None
    assert device.smem_limit() == 1 << 20
