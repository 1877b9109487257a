"""Across consumers: a pod that cannot start because its image is missing names the file reloadd has it from.

kstatus says a Deployment did not progress; the kubelet says ``ErrImageNeverPull``; neither knows that the
image is in ``images/web.tar`` and that its import failed. The kube-manifests consumer asks the
containerd-images consumer of the same reloadd (``reloadd.Providing``, read through
``ConsumerContext.provided``), so the failure of the manifest file names the tarball and why it is not there.
Real node, real containerd: the pod waits because the import really failed (or was really refused).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import reloadd
from reloadd._ops._terminal import format_status
from tests.containerd_images._signing import make_key
from tests.infra import SERVE, busybox_image, write_oci_archive
from tests.kube.node import KubeNode
from tests.waiting import until

from .support import deployment, ensure_namespace, yaml_of
from .test_airgap import _drop, airgap_config

pytestmark = pytest.mark.timeout(300)

@pytest.fixture
async def start(kube_node: KubeNode, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Start a reloadd like the air-gap one (images → the node's containerd, manifests ``after`` images),
    with extra options for the images consumer."""
    running: list[reloadd.Reloader] = []

    async def go(**image_options: Any) -> tuple[reloadd.Reloader, Path, Path]:
        cfg, images, manifests = airgap_config(kube_node, tmp_path, **image_options)
        r = reloadd.Reloader(cfg)
        await r.__aenter__()
        running.append(r)
        await r.wait_idle(60)
        return r, images, manifests

    yield go
    for r in running:
        await r.__aexit__(None, None, None)


def _failed(r: reloadd.Reloader, path: Path) -> dict[str, Any] | None:
    files = r.status()["consumers"]["manifests"]["health"]["files"]
    entry = next((f for f in files if f["path"] == str(path)), None)
    return entry if entry is not None and entry["state"] == "failed" else None


def _deployment_file(manifests: Path, ns: str, app: str, image: str) -> Path:
    dep = deployment(app, ns, image)
    dep["spec"]["progressDeadlineSeconds"] = 10
    path = manifests / f"{app}.yaml"
    _drop(path, lambda p: p.write_text(yaml_of(dep)))
    return path


async def _failure_naming(r: reloadd.Reloader, path: Path, tarball: str) -> str:
    """The failed file's message, once it names the tarball (the pods are read once the deadline fails it)."""
    try:
        await until(lambda: tarball in ((_failed(r, path) or {}).get("message") or ""),
                    what=f"the failure of {path.name} naming {tarball}", timeout=120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; status: {format_status(r.status())}") from None
    entry = _failed(r, path)
    assert entry is not None
    return str(entry["message"])


async def test_a_pod_waiting_for_an_image_whose_tarball_failed_to_import_names_it(
    kube_node: KubeNode, start: Callable[..., Any]
) -> None:
    r, images, manifests = await start()
    ns = ensure_namespace(kube_node.cluster, "source-broken")
    image = "registry.local/web:1.4"
    # its own config (the busybox layer may be in containerd already: an import would not miss it)
    built = busybox_image(image, ("/bin/busybox", "sh", "-c", f"exit 0 # {ns}"))
    config = built.platforms[0].config.digest
    # corrupt: the index names the image, the config it needs is not in the archive
    _drop(images / "web.tar", lambda p: write_oci_archive(p, [built], omit=[config]))
    path = _deployment_file(manifests, ns, "web", image)

    message = await _failure_naming(r, path, "images/web.tar")
    assert "ErrImageNeverPull (image registry.local/web:1.4)" in message, message
    assert f"image {image} is in images/web.tar, import failed: " in message, message
    assert f"blob {config} (application/vnd.oci.image.config.v1+json) of {image} is missing from the archive" \
        in message, message
    assert "images/web.tar, import failed" in format_status(r.status())
    assert image not in kube_node.ctr("images", "ls", "-q").split()  # the pod really has no image


async def test_a_pod_waiting_for_an_image_whose_tarball_was_refused_names_it(
    kube_node: KubeNode, start: Callable[..., Any], tmp_path: Path
) -> None:
    trusted, other = make_key(tmp_path / "keys", "trusted"), make_key(tmp_path / "keys", "other")
    r, images, manifests = await start(verify="require", trusted_keys=[str(trusted.public)], verify_wait="0s")
    ns = ensure_namespace(kube_node.cluster, "source-refused")
    image = "registry.local/refused:1.0"
    built = busybox_image(image, SERVE)
    staged = tmp_path / "refused.tar"
    write_oci_archive(staged, [built])
    sig = other.sig_file(staged)  # signed, by a key reloadd does not trust
    _drop(images / "refused.tar.sig", lambda p: p.write_bytes(sig.read_bytes()))
    _drop(images / "refused.tar", lambda p: p.write_bytes(staged.read_bytes()))
    path = _deployment_file(manifests, ns, "refused", image)

    message = await _failure_naming(r, path, "images/refused.tar")
    assert f"image {image} is in images/refused.tar, refused: REFUSED images/refused.tar" in message, message
    assert "does not verify with any trusted key" in message, message
