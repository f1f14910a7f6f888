"""Options are declared once: flat keyword options, nested configs and CLI flags agree."""
import argparse
import dataclasses

import pytest

from hifc.config import EngineConfig, add_engine_args, engine_config_from_args
from hifc.options import option_fields
from hifc.tiers.config import TierConfig


def parse(*argv: str) -> EngineConfig:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(list(argv)))


def test_flat_options_reach_the_nested_tier_config_and_round_trip():
    config = EngineConfig.from_options("random:tiny-llama", block_size=16, kv_offload="flash",
                                       flash_path="/tmp/x.kvc", flash_size_gib=0.5,
                                       flash_policy="left-append")
    assert config.tier == TierConfig(kv_offload="flash", flash_path="/tmp/x.kvc",
                                     flash_size_gib=0.5, flash_policy="left-append")
    assert config.preemption_mode == "swap"
    assert EngineConfig.from_options(**config.options()) == config


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(TypeError, match="unknown engine option.*flash_sise_gib.*flash_size_gib"):
        EngineConfig.from_options(flash_sise_gib=1)


def test_command_line_flags_give_the_same_config():
    argv = ["--model", "random:tiny-llama", "--block-size", "32", "--kv-offload", "dram",
            "--swap-space", "2", "--enforce-eager", "--no-flash-direct-io"]
    expected = EngineConfig.from_options("random:tiny-llama", block_size=32, kv_offload="dram",
                                         swap_space=2.0, enforce_eager=True,
                                         flash_direct_io=False)
    assert parse(*argv) == expected
    assert parse() == EngineConfig()  # flags left out keep the config's defaults


def test_every_option_has_help_and_cli_ones_a_flag():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    help_text = parser.format_help()
    for f, _ in option_fields(EngineConfig):
        assert f.metadata.get("help"), f"{f.name} has no help text"
        flag = "--" + f.name.replace("_", "-")
        assert (flag in help_text) == f.metadata["cli"], f.name


@pytest.mark.parametrize("argv", [["--flash-size-gib", "inf"], ["--kv-cache-gib", "nan"],
                                  ["--block-size", "17"], ["--kv-offload", "tape"]])
def test_bad_flag_values_are_refused_by_argparse(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_each_choice_is_declared_once():
    tier_fields = {f.name: f for f in dataclasses.fields(TierConfig)}
    from hifc.tiers.allocator import POLICIES
    assert tier_fields["flash_policy"].metadata["choices"] is POLICIES
    with pytest.raises(ValueError, match="flash_policy must be one of append, left-append"):
        TierConfig(flash_policy="lru")


def test_prefix_caching_and_chunked_prefill_are_on_by_default_with_no_flags():
    assert EngineConfig().enable_prefix_caching and EngineConfig().enable_chunked_prefill
    config = parse("--no-enable-prefix-caching", "--no-enable-chunked-prefill")
    assert not config.enable_prefix_caching and not config.enable_chunked_prefill
    assert parse("--enable-prefix-caching").enable_prefix_caching
    with pytest.raises(ValueError, match="enable_prefix_caching must be True or False"):
        EngineConfig(enable_prefix_caching="yes")


def test_a_step_budget_below_max_model_len_needs_chunked_prefill():
    assert EngineConfig(max_model_len=4096, max_num_batched_tokens=512,
                        max_num_seqs=64).max_num_batched_tokens == 512
    with pytest.raises(ValueError, match="without chunked prefill"):
        EngineConfig(max_model_len=4096, max_num_batched_tokens=512, max_num_seqs=64,
                     enable_chunked_prefill=False)
