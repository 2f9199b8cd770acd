# The Cloud Tasks queue that holds opendws's timers (release, start, expiry), and who may use
# it: the functions arm and disarm timers; each timer calls the timer function with an OIDC
# token of the invoker account, so those functions must be able to act as that account.

resource "google_cloud_tasks_queue" "timers" {
  project  = var.project
  name     = var.name
  location = var.region

  rate_limits {
    max_dispatches_per_second = var.max_dispatches_per_second
    max_concurrent_dispatches = var.max_concurrent_dispatches
  }

  # A timer the function failed on is retried with backoff for up to a day; past that the
  # reconciler's sweep ends the run anyway.
  retry_config {
    max_attempts       = var.max_attempts
    max_retry_duration = var.max_retry_duration
    min_backoff        = "1s"
    max_backoff        = "300s"
    max_doublings      = 8
  }

  stackdriver_logging_config {
    sampling_ratio = var.log_sampling_ratio
  }
}

resource "google_cloud_tasks_queue_iam_member" "enqueuer" {
  for_each = toset(var.timer_setters)

  project  = var.project
  location = var.region
  name     = google_cloud_tasks_queue.timers.name
  role     = "roles/cloudtasks.enqueuer"
  member   = each.value
}

# Disarming a timer deletes its task: what arms timers, and what only ends runs.
resource "google_cloud_tasks_queue_iam_member" "deleter" {
  for_each = toset(concat(var.timer_setters, var.timer_deleters))

  project  = var.project
  location = var.region
  name     = google_cloud_tasks_queue.timers.name
  role     = "roles/cloudtasks.taskDeleter"
  member   = each.value
}

# Creating a task that carries the invoker's OIDC token is acting as the invoker.
resource "google_service_account_iam_member" "act_as_invoker" {
  for_each = toset(var.timer_setters)

  service_account_id = var.invoker_account_name
  role               = "roles/iam.serviceAccountUser"
  member             = each.value
}
