"""--cuda-toolkit: wheels from a local pip index, checked against a lock, assembled whole.

The wheels are small ones the test writes (a shell-script nvcc that prints a CUDA release,
headers and libraries as plain files); pip downloads them from a local directory, so the
real download, checking and unpacking code runs without a network.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

import pytest
import yaml

from llamaspec.engine.cuda import assemble, choice, host, toolkit
from llamaspec.errors import LlamaspecError

pytestmark = pytest.mark.unit
NVCC = "#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n"
WHEELS = {
    "nvidia-cuda-nvcc": {"bin/nvcc": NVCC, "bin/nvcc.profile": "TOP = $(_HERE_)/..\n"},
    "nvidia-nvvm": {"nvvm/bin/cicc": "#!/bin/sh\n", "lib/libnvvm.so.4": "ELF"},
    "nvidia-cuda-runtime": {"include/cuda_runtime.h": "", "lib/libcudart.so.13": "ELF"},
    "nvidia-cublas": {
        "include/cublas_v2.h": "",
        "lib/libcublas.so.13": "ELF",
        "lib/libcublasLt.so.13": "ELF",
    },
}


def _wheel(dest: Path, name: str, files: dict[str, str]) -> tuple[str, Path]:
    """A minimal valid wheel: the files under nvidia/cu13/ plus dist-info."""
    dist = name.replace("-", "_")
    arch = toolkit.machine()
    path = dest / f"{dist}-13.0.1-py3-none-{arch and 'manylinux2014_' + arch}.whl"
    info = f"{dist}-13.0.1.dist-info"
    record = []
    with zipfile.ZipFile(path, "w") as z:
        entries = {f"nvidia/cu13/{k}": v for k, v in files.items()}
        entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 13.0.1\n"
        entries[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        entries[f"{info}/WHEEL"] += f"Tag: py3-none-manylinux2014_{toolkit.machine()}\n"
        for arc, text in entries.items():
            zi = zipfile.ZipInfo(arc)
            zi.external_attr = (0o100755 if "bin/" in arc else 0o100644) << 16
            z.writestr(zi, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
            record.append(f"{arc},sha256={digest.decode()},{len(text)}")
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return f"{name}==13.0.1", path


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(project with a llamaspec.lock pinning the test wheels, the pip find-links dir)."""
    links = tmp_path / "links"
    links.mkdir()
    wheels = []
    for name, files in WHEELS.items():
        _, path = _wheel(links, name, files)
        data = path.read_bytes()
        wheels.append(
            {
                "name": name,
                "version": "13.0.1",
                "files": {
                    toolkit.machine(): {
                        "file": path.name,
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "unpacked": 1000,
                    }
                },
            }
        )
    project = tmp_path / "project"
    project.mkdir()
    lock = {"cuda_toolkit": {"release": "13.0", "driver_min": 580, "wheels": wheels}}
    (project / "llamaspec.lock").write_text(yaml.safe_dump(lock))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return project, links


def test_pypi_assembles_a_whole_root_once(index: tuple[Path, Path]) -> None:
    project, links = index
    said: list[str] = []
    tk = choice.resolve("pypi", project, said.append)
    assert toolkit.missing(tk.root) == [] and tk.version == (13, 0)
    assert (tk.root / ".complete").is_file() and (tk.root / "lib64").resolve() == tk.lib_dir
    assert os.readlink(tk.lib_dir / "libcublas.so") == "libcublas.so.13"
    assert (tk.root / "targets" / f"{toolkit.machine()}-linux" / "include" / "cublas_v2.h").exists()
    assert os.access(tk.nvcc, os.X_OK)
    names = {d.name: d for d in tk.defines()}
    assert names["CMAKE_CUDA_COMPILER"].value == str(tk.nvcc)
    assert names["GGML_CUDA_NO_VMM"].value == "ON"  # the wheels ship no libcuda.so
    # the linker follows libggml's own cuBLAS dependency into the toolkit (the RUNPATH
    # names only $ORIGIN/../lib); the artifact id sees the toolkit's key, not its path
    link = names["CMAKE_EXE_LINKER_FLAGS"]
    assert link.value == f"-Wl,-rpath-link,{tk.lib_dir}" and str(tk.root) not in link.key
    assert names["CMAKE_SHARED_LINKER_FLAGS"].value == link.value
    assert str(tk.root) not in (names["CUDAToolkit_ROOT"].key or str(tk.root))
    assert sum("downloading" in s for s in said) == 4
    for wheel in links.iterdir():
        wheel.unlink()  # a second resolve neither downloads nor unpacks
    again: list[str] = []
    assert choice.resolve("pypi", project, again.append).root == tk.root and again == []


def test_a_wheel_whose_sha256_differs_from_the_lock_is_deleted(index) -> None:
    project, links = index
    victim = next(links.glob("nvidia_cublas-*"))
    with zipfile.ZipFile(victim, "a") as z:
        z.writestr("nvidia/cu13/include/extra.h", "tampered")
    with pytest.raises(LlamaspecError) as err:
        choice.resolve("pypi", project, lambda _m: None)
    assert (
        "llamaspec.lock pins" in err.value.message and "nothing was unpacked" in err.value.message
    )
    store = Path(os.environ["LLAMASPEC_CACHE"]) / "cuda-wheels"
    assert not (store / victim.name).exists()
    assert not list((Path(os.environ["LLAMASPEC_CACHE"]) / "cuda-toolkit").glob("pypi-*"))


def test_an_interrupted_assembly_is_never_used(index) -> None:
    project, _ = index
    lock = assemble.pinned(project)
    base = Path(os.environ["LLAMASPEC_CACHE"]) / "cuda-toolkit"
    half = base / assemble.root_name(lock, None)
    (half / "bin").mkdir(parents=True)  # a root without .complete, as a killed run leaves it
    stale = base / ".tmp-x-999999999"
    stale.mkdir()
    tk = choice.resolve("pypi", project, lambda _m: None)
    assert tk.root == half and not toolkit.missing(half) and not stale.exists()


def test_too_little_disk_is_refused_before_downloading(index) -> None:
    project, _ = index
    lock = yaml.safe_load((project / "llamaspec.lock").read_text())
    lock["cuda_toolkit"]["wheels"][0]["files"][toolkit.machine()]["unpacked"] = 10**16
    (project / "llamaspec.lock").write_text(yaml.safe_dump(lock))
    with pytest.raises(LlamaspecError) as err:
        choice.resolve("pypi", project, lambda _m: None)
    assert "Not enough disk for the CUDA toolkit" in err.value.message
    assert "nothing was downloaded" in err.value.message
    assert not (Path(os.environ["LLAMASPEC_CACHE"]) / "cuda-wheels").exists()


def test_a_directory_names_the_missing_piece(tmp_path: Path) -> None:
    root = tmp_path / "cuda"
    for rel, text in {**WHEELS["nvidia-cuda-nvcc"], **WHEELS["nvidia-nvvm"]}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "bin" / "nvcc").chmod(0o755)
    for rel in WHEELS["nvidia-cuda-runtime"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    with pytest.raises(LlamaspecError) as err:
        choice.resolve(str(root), tmp_path, lambda _m: None)
    assert "lacks cuBLAS headers, cuBLAS libraries" in err.value.message
    (root / "bin" / "nvcc").unlink()
    with pytest.raises(LlamaspecError) as err:
        choice.resolve(str(root), tmp_path, lambda _m: None)
    assert "lacks nvcc" in err.value.message
    with pytest.raises(LlamaspecError, match="no such directory"):
        choice.resolve(str(tmp_path / "nope"), tmp_path, lambda _m: None)
    with pytest.raises(LlamaspecError, match="is empty"):
        choice.resolve("  ", tmp_path, lambda _m: None)


def test_archs_the_pinned_toolkit_cannot_target_are_refused_before_download(index) -> None:
    project, _ = index
    with pytest.raises(LlamaspecError) as err:
        choice.check_archs_before_download("pypi", ("61", "86"), project)
    assert "cannot compile for sm_61" in err.value.message and "sm_75" in err.value.message
    choice.check_archs_before_download("pypi", ("75", "90a-real"), project)


def test_driver_versions_against_cuda_majors() -> None:
    assert host.driver_ok("580.65.06", 13) and not host.driver_ok("575.57.08", 13)
    assert host.driver_ok("550.54.15", 12) and not host.driver_ok("garbage", 13)


def test_a_system_toolkit_keeps_its_libraries_under_targets(tmp_path: Path) -> None:
    # measured on a GPU machine: /usr/local/cuda-13.0 has no lib/, only targets/<arch>/lib
    # (lib64 a link to it); looking in lib/ bundled nothing and the artifact was refused
    lib = tmp_path / "targets" / f"{toolkit.machine()}-linux" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.13").write_bytes(b"")
    tk = toolkit.Toolkit(tmp_path, (13, 0), "system", "system CUDA 13.0")
    assert tk.lib_dir == lib and tk.link_dirs() == [lib.resolve()]
    (tmp_path / "lib64").symlink_to(lib)
    assert tk.lib_dir == tmp_path / "lib64" and tk.link_dirs() == [lib.resolve()]


def test_every_nvidia_smi_question_goes_through_the_one_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpu_names, driver_version and the machine description ask a stand-in nvidia-smi."""
    from llamaspec.engine import toolchain

    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-gpu=name,compute_cap) echo 'NVIDIA H100, 9.0' ;;\n"
        "  --query-gpu=driver_version) echo '580.65.06' ;;\n"
        "  --query-gpu=name,driver_version) echo 'NVIDIA H100, 580.65.06' ;;\n"
        "  *) exit 6 ;;\n"
        "esac\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(smi.parent))
    assert host.gpu_names() == ["NVIDIA H100, 9.0"]
    assert host.driver_version() == "580.65.06"
    assert toolchain.machine()["gpus"] == ["NVIDIA H100, driver 580.65.06"]
    proc = host.nvidia_smi(["-L"])
    assert proc is not None and proc.returncode == 6
    assert host.nvidia_smi(["-L"], which=lambda _name: None) is None
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi at all
    assert host.gpu_names() == [] and host.driver_version() is None
    assert toolchain.machine()["gpus"] == []


def test_no_module_but_the_host_probe_runs_nvidia_smi() -> None:
    package = Path(host.__file__).resolve().parents[2]
    others = [
        p.relative_to(package).as_posix()
        for p in sorted(package.rglob("*.py"))
        if p.resolve() != Path(host.__file__).resolve()
        and 'which("nvidia-smi")' in p.read_text(encoding="utf-8")
    ]
    assert others == []
