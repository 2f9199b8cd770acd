# One opendws function (Cloud Functions gen2) from the packaged source: its runtime settings,
# its trigger (a Pub/Sub topic through Eventarc, or HTTP), more Pub/Sub topics through Eventarc
# triggers of its own, and who may invoke it.

locals {
  # A gen2 function's service_config.service is its Cloud Run service's resource name
  # (projects/P/locations/R/services/S); an Eventarc destination names the service itself.
  service_name = element(reverse(split("/", google_cloudfunctions2_function.this.service_config[0].service)), 0)

  # What a dead-letter policy on an Eventarc-made subscription takes ($SUBSCRIPTION is its id):
  # the policy, with the backoff of Eventarc's default retries (10 s to 600 s,
  # eventarc/docs/retry-events), and the right of Pub/Sub's service agent to acknowledge what it
  # forwards (pubsub/docs/handling-failures).
  dead_letter_command = <<-EOT
    gcloud pubsub subscriptions update "$SUBSCRIPTION" --project="$PROJECT" \
      --dead-letter-topic="$DEAD_LETTER_TOPIC" --max-delivery-attempts="$ATTEMPTS" \
      --min-retry-delay=10s --max-retry-delay=600s
    gcloud pubsub subscriptions add-iam-policy-binding "$SUBSCRIPTION" --project="$PROJECT" \
      --member="serviceAccount:$PUBSUB_AGENT" --role=roles/pubsub.subscriber >/dev/null
  EOT
}

resource "google_cloudfunctions2_function" "this" {
  # checkov:skip=CKV_GCP_124:ingress is the caller's choice (default ALLOW_INTERNAL_ONLY). Only ci_hook, api and agent take ALLOW_ALL: GitHub, GitLab, users' browsers and the job VMs call them, and each call is authenticated by the function (HMAC signature, shared token, API key, Google ID token, IAP's signed header, or a VM identity token and the session it was exchanged for).
  project     = var.project
  name        = var.name
  location    = var.region
  description = var.description
  labels      = var.labels

  build_config {
    runtime         = var.runtime
    entry_point     = var.entry_point
    service_account = var.build_service_account

    source {
      storage_source {
        bucket = var.source_bucket
        object = var.source_object
      }
    }
  }

  service_config {
    service_account_email            = var.service_account_email
    available_memory                 = var.memory
    available_cpu                    = var.cpu
    timeout_seconds                  = var.timeout_seconds
    min_instance_count               = var.min_instances
    max_instance_count               = var.max_instances
    max_instance_request_concurrency = var.concurrency
    ingress_settings                 = var.ingress
    all_traffic_on_latest_revision   = true
    environment_variables            = var.environment

    dynamic "secret_environment_variables" {
      for_each = var.secrets
      content {
        key        = secret_environment_variables.key
        project_id = var.project
        secret     = secret_environment_variables.value
        version    = "latest"
      }
    }
  }

  dynamic "event_trigger" {
    for_each = var.pubsub_trigger == null ? [] : [var.pubsub_trigger]
    content {
      trigger_region        = var.region
      event_type            = "google.cloud.pubsub.topic.v1.messagePublished"
      pubsub_topic          = event_trigger.value.topic
      service_account_email = event_trigger.value.service_account_email
      retry_policy          = event_trigger.value.retry ? "RETRY_POLICY_RETRY" : "RETRY_POLICY_DO_NOT_RETRY"
    }
  }
}

# Who may call the function's service: the Eventarc trigger's account, the Cloud Tasks
# invoker, or allUsers for an HTTP function that authenticates its callers itself.
resource "google_cloud_run_service_iam_member" "invoker" {
  # checkov:skip=CKV_GCP_102:allUsers is granted only by ci_hook, api and agent, whose callers (webhooks, browsers and scripts with API keys, job VMs, whose calls after the first carry the function's own session token) carry no token Cloud Run's invoker check takes; the functions authenticate every call themselves and answer 401 otherwise.
  for_each = toset(var.invokers)

  project  = var.project
  location = var.region
  service  = google_cloudfunctions2_function.this.service_config[0].service
  role     = "roles/run.invoker"
  member   = each.value
}

# A function takes one event trigger; every further topic gets an Eventarc trigger of its own
# that delivers to the function's Cloud Run service (eventarc/docs/run/route-trigger-cloud-pubsub:
# type google.cloud.pubsub.topic.v1.messagePublished, an existing topic as the transport, a
# service account holding run.invoker on the service). Each delivers the same CloudEvent as the
# function's own trigger, whose `source` names the topic:
# //pubsub.googleapis.com/projects/P/topics/T (eventarc/docs/cloudevents).
resource "google_eventarc_trigger" "more" {
  for_each = var.more_pubsub_topics

  project         = var.project
  location        = var.region
  name            = "${var.name}-from-${each.key}"
  service_account = try(var.pubsub_trigger.service_account_email, null)
  labels          = var.labels

  matching_criteria {
    attribute = "type"
    value     = "google.cloud.pubsub.topic.v1.messagePublished"
  }

  transport {
    pubsub {
      topic = each.value
    }
  }

  destination {
    cloud_run_service {
      service = local.service_name
      region  = var.region
    }
  }

  # Eventarc retries like Pub/Sub unless told not to (max_attempts = 1 is the only value the
  # API takes): a function whose own trigger does not retry is not retried here either.
  dynamic "retry_policy" {
    for_each = try(var.pubsub_trigger.retry, true) ? [] : [1]
    content {
      max_attempts = 1
    }
  }

  lifecycle {
    precondition {
      condition     = var.pubsub_trigger != null
      error_message = "more_pubsub_topics needs a pubsub_trigger: its service account and retry apply to them too."
    }
  }
}

# Eventarc creates and owns each trigger's Pub/Sub subscription, and neither it nor the provider
# can give that subscription a dead-letter policy; this sets one on it after each (re)creation
# of the trigger, with gcloud, and lets Pub/Sub's service agent acknowledge what it forwards.
resource "terraform_data" "dead_letter" {
  count = var.pubsub_trigger != null && var.dead_letter != null ? 1 : 0

  triggers_replace = [
    google_cloudfunctions2_function.this.event_trigger[0].trigger,
    var.pubsub_trigger.topic,
    var.dead_letter.topic,
    var.dead_letter.max_delivery_attempts,
  ]

  provisioner "local-exec" {
    interpreter = ["/bin/bash", "-c"]
    command     = <<-EOT
      set -euo pipefail
      SUBSCRIPTION=$(gcloud eventarc triggers describe "$TRIGGER" --project="$PROJECT" \
        --location="$REGION" --format='value(transport.pubsub.subscription)')
      ${local.dead_letter_command}
    EOT
    environment = {
      PROJECT           = var.project
      REGION            = var.region
      TRIGGER           = element(split("/", google_cloudfunctions2_function.this.event_trigger[0].trigger), 5)
      DEAD_LETTER_TOPIC = var.dead_letter.topic
      ATTEMPTS          = tostring(var.dead_letter.max_delivery_attempts)
      PUBSUB_AGENT      = var.dead_letter.pubsub_service_agent
    }
  }
}

# The same for the further triggers, whose subscription the trigger resource names
# (transport.pubsub.subscription, projects/P/subscriptions/S).
resource "terraform_data" "more_dead_letter" {
  for_each = var.dead_letter == null ? {} : var.more_pubsub_topics

  triggers_replace = [
    google_eventarc_trigger.more[each.key].transport[0].pubsub[0].subscription,
    var.dead_letter.topic,
    var.dead_letter.max_delivery_attempts,
  ]

  provisioner "local-exec" {
    interpreter = ["/bin/bash", "-c"]
    command     = <<-EOT
      set -euo pipefail
      ${local.dead_letter_command}
    EOT
    environment = {
      PROJECT           = var.project
      SUBSCRIPTION      = element(split("/", google_eventarc_trigger.more[each.key].transport[0].pubsub[0].subscription), 3)
      DEAD_LETTER_TOPIC = var.dead_letter.topic
      ATTEMPTS          = tostring(var.dead_letter.max_delivery_attempts)
      PUBSUB_AGENT      = var.dead_letter.pubsub_service_agent
    }
  }
}
