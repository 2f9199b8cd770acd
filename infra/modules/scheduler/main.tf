# The tick: a message on reconcile-ticks on a schedule, so that a reconcile pass runs even when
# nothing nudges it (a stockout ends, a cool-down lapses, a calendar block starts).

resource "google_cloud_scheduler_job" "tick" {
  project     = var.project
  region      = var.region
  name        = var.name
  description = "opendws: a reconcile pass on every tick"
  schedule    = var.schedule
  time_zone   = var.time_zone

  # A missed tick is not worth retrying: the next one comes.
  retry_config {
    retry_count = 0
  }

  pubsub_target {
    topic_name = var.topic_id
    data       = base64encode(jsonencode({ kind = "tick" }))
    attributes = { source = "cloud-scheduler" }
  }
}
