"""The YAML of defaults and its schema describe the same keys, and config is read at call time."""
import os

import dask
import pytest
import yaml

import dask_research
from dask_research import config


def _walk_defaults(node, prefix=()):
    for key, value in node.items():
        path = prefix + (key,)
        if isinstance(value, dict):
            yield from _walk_defaults(value, path)
        else:
            yield path, value


def _walk_schema(node, prefix=()):
    for key, value in node["properties"].items():
        path = prefix + (key,)
        if value.get("type") == "object":
            yield from _walk_schema(value, path)
        else:
            yield path, value


def _load(name):
    with open(os.path.join(os.path.dirname(config.__file__), name)) as f:
        return yaml.safe_load(f)


def test_yaml_and_schema_have_the_same_keys():
    defaults = dict(_walk_defaults(_load("research.yaml")))
    schema = dict(_walk_schema(_load("research-schema.yaml")))
    assert set(defaults) == set(schema), (
        f"only in research.yaml: {sorted(set(defaults) - set(schema))}; "
        f"only in schema: {sorted(set(schema) - set(defaults))}"
    )


_TYPES = {"integer": int, "number": (int, float), "boolean": bool, "string": str,
          "null": type(None), "array": list, "object": dict}


def test_defaults_match_their_declared_types():
    defaults = dict(_walk_defaults(_load("research.yaml")))
    schema = dict(_walk_schema(_load("research-schema.yaml")))
    for path, value in defaults.items():
        declared = schema[path]["type"]
        declared = declared if isinstance(declared, list) else [declared]
        ok = any(isinstance(value, _TYPES[t]) and not (t in ("integer", "number")
                 and isinstance(value, bool)) for t in declared)
        assert ok, f"research.{'.'.join(path)}={value!r} is not {declared}"
        assert schema[path].get("description"), f"research.{'.'.join(path)} has no description"


def test_defaults_are_loaded_and_read_at_call_time():
    assert dask.config.get("research.montecarlo.bins") == 256
    assert config.resolve("montecarlo.bins") == 256
    with dask.config.set({"research.montecarlo.bins": 17}):
        assert config.resolve("montecarlo.bins") == 17
        assert config.resolve("montecarlo.bins", 5) == 5
    assert config.resolve("montecarlo.bins") == 256


def test_version_and_lazy_subpackages():
    assert dask_research.__version__.count(".") == 2
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dask_research.nope


def test_a_typo_in_a_research_key_is_warned_once_with_the_setting_it_resembles():
    config._warned.clear()
    config._looked.clear()
    with dask.config.set({"research.montecarlo.verfy": 0}):
        with pytest.warns(config.ConfigWarning, match=r"research.montecarlo.verfy is not a dask-research "
                                                      r"setting and is ignored \(did you mean research.montecarlo.verify\?\)"):
            assert config.resolve("montecarlo.verify") == 4
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            config.resolve("montecarlo.verify")          # once
    config._warned.clear()
    config._looked.clear()


def test_a_research_value_of_the_wrong_type_is_one_config_error_naming_it():
    from dask_research.exceptions import ConfigError

    with dask.config.set({"research.montecarlo.verify": "four"}):
        with pytest.raises(ConfigError, match=r"research.montecarlo.verify='four' is invalid; expected an integer"):
            config.resolve("montecarlo.verify")
    with dask.config.set({"research.replay.overflow": "drop"}):
        with pytest.raises(ConfigError, match="one of 'raise', 'keep-newest'"):
            config.resolve("replay.overflow")
    with dask.config.set({"research.montecarlo.verify": True}):
        with pytest.raises(ConfigError):
            config.resolve("montecarlo.verify")                # a boolean is not a count
    assert config.resolve("montecarlo.verify", "given wins") == "given wins"


def test_dask_settings_passed_to_the_embedded_cluster_are_never_called_unknown():
    import warnings

    with dask.config.set({"research.cluster.distributed.scheduler.work-stealing": False}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            config.resolve("cluster.distributed")
