"""The champion watcher against a real registry: follow the alias, survive a version that cannot load."""

from __future__ import annotations

from sparktune.serve.champion import ChampionWatcher, NoModelError, load_version


def test_a_version_that_cannot_load_leaves_the_old_one_serving_until_the_alias_moves(registry, tmp_path):
    name = registry.register("serving-broken-version")
    client = registry.client()
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    broken = str(client.create_model_version(name, source=str(empty)).version)  # v3: no MLmodel in it
    loads: list[str] = []

    def counting_loader(model_name, version, tracking_uri, download_dir):
        loads.append(version)
        return load_version(model_name, version, tracking_uri, download_dir)

    downloads = tmp_path / "dl"
    watcher = ChampionWatcher(name, "champion", registry.tracking_uri, downloads, loader=counting_loader)
    assert watcher.check().changed and watcher.require_current().version == "1"
    assert watcher.require_current().predict(["a refund"]).predictions == ["billing_refund"]

    client.set_registered_model_alias(name, "champion", broken)
    failed = watcher.check()
    assert not failed.changed and failed.version == broken and watcher.current.version == "1"
    assert f"v{broken} (champion) failed to load" in failed.error and "holds no MLmodel file" in failed.error
    assert "POST /admin/reload" in failed.error
    watcher.check()
    assert loads == ["1", broken], "a version that failed is not loaded again at every poll"
    watcher.check(force=True)
    assert loads == ["1", broken, broken], "a reload asks for it again"

    client.set_registered_model_alias(name, "champion", "2")
    moved = watcher.check()
    assert moved.changed and moved.previous_version == "1" and watcher.current.version == "2"
    assert watcher.last_error is None

    client.delete_registered_model_alias(name, "champion")
    gone = watcher.check()
    assert gone.version is None and watcher.current.version == "2"  # keeps answering
    assert "has no version of" in gone.error and "promote one" in gone.error


def test_nothing_to_serve_says_why_and_how_to_fix_it(registry, tmp_path):
    name = registry.register("serving-never-promoted", champion=None)
    watcher = ChampionWatcher(name, "champion", registry.tracking_uri, tmp_path / "dl")
    try:
        watcher.require_current()
    except NoModelError as exc:
        assert "still loading" in str(exc)  # before the first check
    else:
        raise AssertionError("no model was loaded, yet require_current answered")
    watcher.check()
    message = watcher.unavailable_message()
    assert message.startswith("No model is loaded: the registry at sqlite:")
    assert f"MlflowClient().set_registered_model_alias('{name}', 'champion', <version>)" in message
