import pytest

from shipyard import instance_types
from shipyard.errors import ValidationError


def test_ml_types_map_to_counts_capped_to_this_machine():
    res = instance_types.resolve("ml.m5.4xlarge")
    assert (res.nominal_cpus, res.nominal_gpus) == (16, 0)
    assert res.num_cpus == min(16, instance_types.machine_cpus())
    gpu = instance_types.resolve("ml.p3.8xlarge")
    assert (gpu.nominal_cpus, gpu.nominal_gpus) == (32, 4)
    assert gpu.num_gpus == min(4, instance_types.machine_gpus())
    assert "ml.p3.8xlarge" in gpu.describe()


@pytest.mark.parametrize("name", ["ml.zz.huge", "m5.xlarge", "ml.p9.xlarge", ""])
def test_unknown_types_are_refused(name):
    with pytest.raises(ValidationError):
        instance_types.resolve(name)


def test_an_unknown_family_is_refused_naming_the_known_ones():
    with pytest.raises(ValidationError) as err:
        instance_types.check_family("ml.q9.xlarge")
    text = str(err.value)
    assert "no instance family 'q9'" in text and "m5, m5d" in text and "p3" in text
    assert "SHIPYARD_CUSTOM_INSTANCE_FAMILIES=q9" in text
    instance_types.check_family("ml.q9.xlarge", frozenset({"q9"}))  # allowed: no error
    for known in ("ml.m5.xlarge", "ml.c6i.large", "ml.p3.2xlarge", "local", "local_gpu"):
        instance_types.check_family(known)
