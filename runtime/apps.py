from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    name = "runtime"
    verbose_name = "Agent runtime"

    def ready(self) -> None:
        from runtime import live
        from runtime.signals import commit_announced

        def forward(sender, notice, **kwargs):
            live.publish_commit(notice)

        commit_announced.connect(forward, weak=False, dispatch_uid="runtime.live.forward")
