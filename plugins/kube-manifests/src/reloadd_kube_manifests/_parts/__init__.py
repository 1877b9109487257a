"""The parts :class:`~reloadd_kube_manifests.KubeManifestsConsumer` is composed of, one concern each.

Each part is a mixin over :class:`~.base.ConsumerBase`, which builds the state they share once and declares
the few calls one part makes into another, so each part typechecks on its own:

- ``base``: the shared state, which files the consumer takes (``accepts``, ``key``) and the files present.
- ``apply``: one file's turn in a pass (applied or removed), its result, warnings and Events.
- ``prune``: prune safety (``max_prune``, held removals) and the move grace of a deleted file.
- ``drift``: guarded objects (the ``kube-watch`` source, drift reports, ``plan_drift``) and the resync timer.
- ``health``: health tracking glue (the report, a file failing or recovering: log lines and Events).
- ``waves``: files that wait for others (namespaces and CRDs first, ``reloadd.io/wave``).
- ``lease``: leader election glue (standby, status) and the ApplySets of files this folder lacks.
- ``plan``: ``reloadd plan`` (a dry run of a pass).

The pass itself (``handle`` and its steps), the connection and the lifecycle stay in ``_consumer``.
"""
