"""zoo.cli.info: ``python -m zoo info``, what this installation has and what to do about it."""

from zoo.cli import info, main


def printed(capsys, *argv):
    status = main(["info", *argv])
    return status, capsys.readouterr().out


def test_info_reports_versions_pair_devices_threads_and_data(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("ZOO_DATA", str(tmp_path / "nowhere"))
    monkeypatch.delenv("ZOO_DEVICE", raising=False)
    status, out = printed(capsys)
    labels = [line.split(":")[0] for line in out.splitlines() if ":" in line]
    for label in ("python", "bnn-zoo", "torch", "torchvision", "pyro-ppl", "arviz",
                  "torch + torchvision", "lightning [distributed]", "laplace-torch [laplace]",
                  "CUDA devices", "zoo.fit's device", "threads", "data root", "MNIST"):  # fmt: skip
        assert label in labels, (label, out)
    assert "a working pair (nms ran)" in out
    assert "($ZOO_DATA)" in out and "nowhere/MNIST/raw" in out
    assert "problems:" in out and "zoo.data.mnist(download=True)" in out
    assert status == 0  # missing MNIST is a problem with a cure, not a broken installation


def test_info_finds_mnist_under_a_given_root(capsys, tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in info.MNIST_FILES:
        (raw / name).write_bytes(b"")
    status, out = printed(capsys, "--data-root", str(tmp_path))
    assert f"found in {raw}" in out and "(--data-root)" in out
    assert status == 0


def test_info_exits_1_on_an_unusable_device_and_says_what_to_do(capsys, monkeypatch):
    monkeypatch.setenv("ZOO_DEVICE", "nonsense:7")
    status, out = printed(capsys)
    assert status == 1
    assert "zoo.fit's device (the library cannot work until this is fixed)" in out
    assert "$ZOO_DEVICE='nonsense:7'" in out and "unset or correct it" in out


def test_a_missing_required_package_is_fatal(capsys, monkeypatch):
    real = info.installed_version
    monkeypatch.setattr(info, "installed_version", lambda n: None if n == "arviz" else real(n))
    status, out = printed(capsys)
    assert status == 1 and "arviz:" in out and "not installed" in out


def test_a_data_root_that_is_a_file_is_named_as_one(capsys, tmp_path):
    file = tmp_path / "mnist.tar"
    file.write_text("not a folder")
    status, out = printed(capsys, "--data-root", str(file))
    assert "is a file, not a folder" in out and "pass the folder that holds MNIST/raw" in out
    assert str(file / "MNIST") not in out  # no advice to look for a folder inside the file
