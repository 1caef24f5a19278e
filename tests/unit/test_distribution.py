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


# Issue 16 item 4: a misspelt key used to leave the section disabled, and the job trained on
# each instance alone and reported Completed.
@pytest.mark.parametrize(
    "given,hint",
    [
        ({"parameter_server": {"enable": True}}, "did you mean 'enabled'"),
        ({"mpi": {"enable": True, "processes_per_host": 2}}, "did you mean 'enabled'"),
        ({"mpi": {"enabled": True, "process_per_host": 2}}, "did you mean 'processes_per_host'"),
        ({"mpi": {"enabled": True, "custom_mpi_option": "-x A"}}, "'custom_mpi_options'"),
        ({"smdistributed": {"dataparallel": {"enable": True}}}, "did you mean 'enabled'"),
        ({"torch_distributed": {"enabled": True, "master_prot": 29501}}, "'master_port'"),
        ({"pytorchddp": {"Enabled": True}}, "did you mean 'enabled'"),
        ({"multi_worker_mirrored_strategy": {"enabeld": True}}, "did you mean 'enabled'"),
        ({"parameter_server": {"enabled": True, "layuot": "tf2"}}, "did you mean 'layout'"),
        ({"parameter_server": {"enabled": True, "consistancy": "sync"}}, "'consistency'"),
        ({"mpi": {"enabled": False, "color": 1}}, "unknown key"),
        ({"smdistributed": {"modelparallel": {"enabled": True, "parametrs": {}}}}, "'parameters'"),
        ({"parameterserver": {"enabled": True}}, "did you mean 'parameter_server'"),
    ],
)
def test_unknown_keys_in_a_section_are_refused_with_a_spelling_hint(given, hint):
    with pytest.raises(DistributionError, match=hint):
        d.parse(given)


def test_known_keys_cover_what_the_runners_accept():
    from shipyard.jobplan.runners import MPI_OPTIONS, TORCH_OPTIONS
    from shipyard.ps import options as ps_options
    from shipyard.tf import cluster

    assert set(MPI_OPTIONS) <= set(d.SECTION_KEYS[d.MPI])
    torch_keys = TORCH_OPTIONS - {"kind", "custom_mpi_options"}  # that one: smddp
    assert torch_keys <= set(d.SECTION_KEYS[d.TORCH_DISTRIBUTED])
    assert set(cluster.PS_OPTION_KEYS) <= set(d.SECTION_KEYS[d.PARAMETER_SERVER])
    ps_keys = set(ps_options._KNOWN) | set(ps_options._PASSTHROUGH) - {"kind"}
    assert ps_keys <= set(d.SECTION_KEYS[d.PARAMETER_SERVER])
    assert set(cluster.MWMS_OPTION_KEYS) <= set(d.SECTION_KEYS[d.MWMS])


def test_a_disabled_section_with_known_options_is_fine():
    assert d.parse({"mpi": {"enabled": False, "processes_per_host": 2}}).kind is None


# Issue 28: SageMaker's data-parallel library had a TensorFlow client for TF 2.3-2.11 (the
# SDK's SM_DATAPARALLEL_SUPPORTED_FRAMEWORK_VERSIONS); it runs there on the mpi runner.
def test_smddp_runs_on_mpi_for_tensorflow_and_torchrun_for_pytorch():
    ddp = d.parse({"smdistributed": {"dataparallel": {"enabled": True}}})
    assert ddp.runner_for("tensorflow") == "mpi"
    assert ddp.runner_for("pytorch") == "torch_distributed"
    assert ddp.runner_for(None) == "torch_distributed"


@pytest.mark.parametrize("version", [None, "2.3", "2.3.1", "2.4.1", "2.9.2", "2.11", "2.11.0"])
def test_smddp_tensorflow_versions_sagemaker_ran_are_accepted(version):
    assert d.smddp_tensorflow_refusal(version) is None


@pytest.mark.parametrize("version", ["2.2", "2.12", "2.16.1", "1.15", "latest", "2"])
def test_smddp_tensorflow_versions_sagemaker_never_ran_are_refused_with_the_range(version):
    reason = d.smddp_tensorflow_refusal(version)
    assert reason and repr(version) in reason
    assert "TensorFlow 2.3 to 2.11" in reason and "'mpi'" in reason
