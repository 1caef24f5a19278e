"""The toolkit's encoding rules, checked against literal expectations."""

from shipyard.agent import mapping


def test_cmd_args_sorted_single_letter_dict_bool_list_none():
    hps = {
        "epochs": 3,
        "b": True,
        "layers": [64, 32],
        "opt": {"name": "sgd", "m": 0.9},
        "learning-rate": 0.01,
        "x": None,
        "name": "a b",
    }
    assert mapping.to_cmd_args(hps) == [
        "-b",
        "True",
        "--epochs",
        "3",
        "--layers",
        "[64, 32]",
        "--learning-rate",
        "0.01",
        "--name",
        "a b",
        "--opt",
        "m=0.9,name=sgd",
        "-x",
        "",
    ]


def test_env_values_strings_as_is_none_empty_rest_compact_sorted_json():
    env = mapping.to_env_vars(
        {
            "a": "text",
            "b": None,
            "c": {"z": 1, "a": [1, 2]},
            "d": True,
            "e": 1.5,
            "hp_learning-rate": 0.1,
        }
    )
    assert env == {
        "SM_A": "text",
        "SM_B": "",
        "SM_C": '{"a":[1,2],"z":1}',
        "SM_D": "true",
        "SM_E": "1.5",
        "SM_HP_LEARNING-RATE": "0.1",
    }


def test_env_values_are_ascii_escaped():
    assert mapping.env_value({"k": "é"}) == '{"k":"\\u00e9"}'


def test_decode_falls_back_to_raw_string():
    assert mapping.decode_hyperparameters({"a": '"x"', "b": "3", "c": "not json"}) == {
        "a": "x",
        "b": 3,
        "c": "not json",
    }


def test_split_reserved_and_framework_keys():
    reserved, user = mapping.split_hyperparameters(
        {
            "sagemaker_program": "t.py",
            "sagemaker_mpi_enabled": True,
            "_tuning_objective_metric": "x",
            "epochs": 1,
        }
    )
    assert user == {"epochs": 1}
    assert set(reserved) == {
        "sagemaker_program",
        "sagemaker_mpi_enabled",
        "_tuning_objective_metric",
    }
