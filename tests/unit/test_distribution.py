import pytest

from shipyard import distribution as d
from shipyard.errors import DistributionError


@pytest.mark.parametrize(
    "given,kind",
    [
        (None, None),
        ({}, None),
        ({"parameter_server": {"enabled": True}}, d.PARAMETER_SERVER),
        ({"parameter_server": {"enabled": False}}, None),
        ({"mpi": {"enabled": True, "processes_per_host": 2}}, d.MPI),
        ({"smdistributed": {"dataparallel": {"enabled": True}}}, d.SMDDP),
        ({"pytorchddp": {"enabled": True}}, d.PYTORCHDDP),
        ({"torch_distributed": {"enabled": True}}, d.TORCH_DISTRIBUTED),
        ({"multi_worker_mirrored_strategy": {"enabled": True}}, d.MWMS),
    ],
)
def test_every_sagemaker_form_is_recognised(given, kind):
    assert d.parse(given).kind == kind


@pytest.mark.parametrize(
    "given,message",
    [
        ({"horovod": {"enabled": True}}, "unknown distribution key"),
        ({"mpi": {"enabled": True}, "parameter_server": {"enabled": True}}, "two distributions"),
        ({"mpi": {"enabled": True, "processes_per_host": 0}}, "processes_per_host"),
        ({"mpi": {"enabled": True, "custom_mpi_options": 3}}, "custom_mpi_options"),
        ({"mpi": {"enabled": "yes"}}, "True or False"),
        ({"mpi": True}, "must be a dict"),
        ({"smdistributed": {"modelparallel": {"enabled": True}}}, "not supported"),
        ({"instance_groups": []}, "heterogeneous"),
        ("mpi", "must be a dict"),
    ],
)
def test_bad_forms_are_refused_with_a_reason(given, message):
    with pytest.raises(DistributionError, match=message):
        d.parse(given)


def test_reserved_hyperparameters_match_the_sdk():
    mpi = d.parse({"mpi": {"enabled": True, "processes_per_host": 4}})
    assert d.reserved_hyperparameters(mpi, "ml.p3.8xlarge") == {
        "sagemaker_mpi_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": 4,
        "sagemaker_mpi_custom_mpi_options": "",
    }
    ps = d.parse({"parameter_server": {"enabled": True}})
    assert d.reserved_hyperparameters(ps, "local") == {"sagemaker_parameter_server_enabled": True}
    ddp = d.parse({"smdistributed": {"dataparallel": {"enabled": True}}})
    assert d.reserved_hyperparameters(ddp, "ml.p4d.24xlarge") == {
        "sagemaker_distributed_dataparallel_enabled": True,
        "sagemaker_instance_type": "ml.p4d.24xlarge",
        "sagemaker_distributed_dataparallel_custom_mpi_options": "",
    }
