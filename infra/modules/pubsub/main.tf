# The three topics opendws speaks through, the dead-letter topic and subscription that keep
# request messages intake could not take, and who may publish where.

locals {
  # Topic names are fixed by the code (opendws.adapters.pubsub and opendws.bootstrap).
  topics = {
    requests = "capacity-requests"
    events   = "capacity-events"
    ticks    = "reconcile-ticks"
  }
  publishers = {
    requests = var.request_publishers
    events   = var.event_publishers
    ticks    = var.tick_publishers
  }
  publisher_bindings = merge([
    for key, members in local.publishers : {
      for member in members : "${key}/${member}" => { topic = key, member = member }
    }
  ]...)
}

resource "google_pubsub_topic" "topic" {
  for_each = local.topics

  project                    = var.project
  name                       = each.value
  labels                     = var.labels
  message_retention_duration = var.message_retention
  kms_key_name               = var.kms_key_name
}

resource "google_pubsub_topic_iam_member" "publisher" {
  for_each = local.publisher_bindings

  project = var.project
  topic   = google_pubsub_topic.topic[each.value.topic].name
  role    = "roles/pubsub.publisher"
  member  = each.value.member
}

resource "google_pubsub_topic_iam_member" "event_subscriber" {
  for_each = toset(var.event_subscribers)

  project = var.project
  topic   = google_pubsub_topic.topic["events"].name
  role    = "roles/pubsub.subscriber"
  member  = each.value
}

# Request messages that intake failed on max_delivery_attempts times land here, and wait in
# the subscription below (7 days) to be looked at or replayed; nothing else reads them.
resource "google_pubsub_topic" "requests_dead_letter" {
  project                    = var.project
  name                       = "capacity-requests-dead-letter"
  labels                     = var.labels
  message_retention_duration = var.message_retention
  kms_key_name               = var.kms_key_name
}

resource "google_pubsub_subscription" "requests_dead_letter" {
  project                    = var.project
  name                       = "capacity-requests-dead-letter"
  topic                      = google_pubsub_topic.requests_dead_letter.id
  labels                     = var.labels
  message_retention_duration = "604800s"
  retain_acked_messages      = true
  ack_deadline_seconds       = 60

  expiration_policy {
    ttl = "" # never expires, however long nobody pulls
  }
}

# Pub/Sub forwards dead letters as its own service agent: it must publish to the dead-letter
# topic (and acknowledge on the source subscription; see the function module's dead_letter).
resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  project = var.project
  topic   = google_pubsub_topic.requests_dead_letter.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${var.pubsub_service_agent}"
}

resource "google_pubsub_subscription_iam_member" "dead_letter_reader" {
  for_each = toset(var.dead_letter_readers)

  project      = var.project
  subscription = google_pubsub_subscription.requests_dead_letter.name
  role         = "roles/pubsub.subscriber"
  member       = each.value
}
