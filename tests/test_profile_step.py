"""scripts/profile_step.py: the trainer's own step under torch.profiler, as markdown tables."""
import pytest

import hardware
import profile_step


@pytest.fixture
def quick_peak(monkeypatch):
    monkeypatch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)  # not what is tested


def table(output: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose first header cell is `header`."""
    lines = output.split(f"| {header} |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_profiles_the_phases_and_operators_of_the_training_step(mlm_workdir, quick_peak, capsys):
    profile_step.main(["--warmup", "1", "--steps", "2", "--rows", "5"])
    output = capsys.readouterr().out
    assert output.startswith("2 x 64, batch 16 x 64, mlm, device cpu, float32, compile false: ")
    phases = table(output, "phase")
    assert [row[0] for row in phases] == ["forward", "backward", "gradient clip", "optimizer",
                                          "the step (timed without the profiler)"]
    assert sum(float(row[2].rstrip("%")) for row in phases[:4]) == pytest.approx(100, abs=0.5)
    kinds = {row[0]: float(row[2].rstrip("%")) for row in table(output, "kind of work")}
    assert list(kinds) == [kind for kind, _ in profile_step.TIME_KINDS] + ["other"]
    assert sum(kinds.values()) == pytest.approx(100, abs=0.5) and kinds["matmul"] > 10
    operators = table(output, "operator")
    assert len(operators) == 5 and any("aten::mm" in row[0] or "aten::addmm" in row[0] for row in operators)
    assert not (mlm_workdir / "runs").exists()


def test_profiles_fine_tuning_too(mlm_workdir, quick_peak, rotten_tomatoes, capsys):
    import make_demo
    make_demo.write_sst2(mlm_workdir / "datasets", rotten_tomatoes, seed=123)
    profile_step.main(["--task-type", "sst2", "--warmup", "0", "--steps", "1", "--grad-clip", "0"])
    phases = table(capsys.readouterr().out, "phase")
    assert [row[0] for row in phases][:3] == ["forward", "backward", "optimizer"]


@pytest.mark.parametrize("arguments, message", [
    (["--steps", "0"], "--steps and --rows >= 1"),
    (["--mask-rate", "2"], "mask-rate"),
])
def test_bad_arguments_are_one_line(mlm_workdir, arguments, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        profile_step.main(arguments)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1


@pytest.mark.parametrize("name, kind", [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>", "attention"),
    ("fmha_cutlassf_bf16_aligned_64x64_rf_sm80", "attention"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("nvjet_tst_192x192_64x4_1x2_h_bz_coopb_tnt", "matmul"),
    ("aten::addmm", "matmul"),
    ("mkldnn::_linear_pointwise", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
    ("aten::native_layer_norm_backward", "norm"),
    ("aten::_fused_adamw_", "optimizer"),
    ("void at::native::multi_tensor_apply_kernel<at::native::fusedadammathfunctor<float, 4>>", "optimizer"),
    ("triton_per_fused_add_native_layer_norm_native_layer_norm_backward_7", "norm"),
    ("triton_red_fused__log_softmax_nll_loss_forward_3", "softmax and loss"),
    ("memcpy htod (pageable -> device)", "copies and casts"),
    ("aten::copy_", "copies and casts"),
    ("triton_poi_fused_gelu_gelu_backward_5", "other"),
])
def test_a_profiled_kernel_is_counted_under_its_kind(name, kind):
    """Names as torch.profiler records them on an H100/H200 (cuDNN, flash and cutlass attention, cuBLAS
    and nvjet GEMMs, inductor's Triton kernels) and on a CPU (aten operators)."""
    assert profile_step.time_kind(name) == kind
