from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    name = "runtime"
    verbose_name = "Agent runtime"

    def ready(self) -> None:
        from runtime.signals import commit_announced

        commit_announced.connect(forward_commits, weak=False, dispatch_uid="runtime.live.forward")


def forward_commits(sender, notice, **kwargs) -> None:
    """Tell live viewers of every commit (best-effort; see runtime.live)."""
    from runtime import live

    live.publish_commit(notice)
