# The topics opendws speaks through, the dead-letter topic and subscription that keep request
# messages intake could not take, and who may publish and read where.
#
# Who asks is the topic, not the message: Pub/Sub does not tell a subscriber who published a
# message, so intake takes the tenant from the topic a message arrived on, and each tenant's
# topic admits that tenant's principals only (see "Who is trusted for what" in infra/README.md).

locals {
  # Topic names are fixed by the code (opendws.ports and opendws.bootstrap).
  topics = {
    events = "capacity-events"
    ticks  = "reconcile-ticks"
  }
  publishers = {
    events = var.event_publishers
    ticks  = var.tick_publishers
  }
  publisher_bindings = merge([
    for key, members in local.publishers : {
      for member in members : "${key}/${member}" => { topic = key, member = member }
    }
  ]...)

  # The request topics, by the identity a message on each speaks for: a tenant's own
  # capacity-requests-{tenant}; the admins' capacity-admin-requests; and, only when
  # shared_requests_topic is on, the shared capacity-requests, which trusts every publisher.
  # "admin" and "shared" are no tenant's names (the root's variable refuses them).
  shared_request_topic = { for key, name in { shared = "capacity-requests" } : key => name if var.shared_requests_topic }
  request_topics = merge(
    { for tenant in keys(var.tenants) : tenant => "capacity-requests-${tenant}" },
    { admin = "capacity-admin-requests" },
    local.shared_request_topic,
  )
  request_publishers = merge(
    { for tenant, spec in var.tenants : tenant => distinct(concat(spec.publishers, var.every_tenant_publishers)) },
    { admin = distinct(var.admins) },
    { for key in keys(local.shared_request_topic) : key => distinct(var.request_publishers) },
  )
  request_publisher_bindings = merge([
    for key, members in local.request_publishers : {
      for member in members : "${key}/${member}" => { topic = key, member = member }
    }
  ]...)

  # Each tenant reads its own events: a subscription on capacity-events that delivers only the
  # messages whose `tenant` attribute is the tenant's (pubsub/docs/subscription-message-filter;
  # every event carries request_id, tenant and state as attributes).
  event_subscriptions = {
    for tenant in keys(var.tenants) : tenant => {
      name   = "capacity-events-${tenant}"
      filter = "attributes.tenant = \"${tenant}\""
    }
  }
  event_subscriber_bindings = merge([
    for tenant, spec in var.tenants : {
      for member in distinct(spec.subscribers) : "${tenant}/${member}" => { tenant = tenant, member = member }
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

# Topic-level subscriber rights let a member attach any subscription to capacity-events,
# unfiltered: the operators'. Tenants get their own filtered subscription below instead.
resource "google_pubsub_topic_iam_member" "event_subscriber" {
  for_each = toset(var.event_subscribers)

  project = var.project
  topic   = google_pubsub_topic.topic["events"].name
  role    = "roles/pubsub.subscriber"
  member  = each.value
}

# Request topics ------------------------------------------------------------------------------

resource "google_pubsub_topic" "requests" {
  for_each = local.request_topics

  project                    = var.project
  name                       = each.value
  labels                     = var.labels
  message_retention_duration = var.message_retention
  kms_key_name               = var.kms_key_name
}

# The shared capacity-requests was the only request topic before tenants had their own; an
# install that keeps it (shared_requests_topic = true) keeps the same topic.
moved {
  from = google_pubsub_topic.topic["requests"]
  to   = google_pubsub_topic.requests["shared"]
}

# Publishing on a request topic is acting as whom that topic speaks for.
resource "google_pubsub_topic_iam_member" "request_publisher" {
  for_each = local.request_publisher_bindings

  project = var.project
  topic   = google_pubsub_topic.requests[each.value.topic].name
  role    = "roles/pubsub.publisher"
  member  = each.value.member
}

# Tenants' events ----------------------------------------------------------------------------

resource "google_pubsub_subscription" "tenant_events" {
  for_each = local.event_subscriptions

  project                    = var.project
  name                       = each.value.name
  topic                      = google_pubsub_topic.topic["events"].id
  filter                     = each.value.filter
  labels                     = var.labels
  message_retention_duration = "604800s"
  ack_deadline_seconds       = 60

  expiration_policy {
    ttl = "" # never expires, however long the tenant reads nothing
  }
}

resource "google_pubsub_subscription_iam_member" "tenant_event_subscriber" {
  for_each = local.event_subscriber_bindings

  project      = var.project
  subscription = google_pubsub_subscription.tenant_events[each.value.tenant].name
  role         = "roles/pubsub.subscriber"
  member       = each.value.member
}

# Dead letters -------------------------------------------------------------------------------

# Request messages that intake failed on max_delivery_attempts times, on any request topic,
# land here, and wait in the subscription below (7 days) to be looked at or replayed; nothing
# else reads them. Pub/Sub names the subscription each came from in its
# CloudPubSubDeadLetterSourceSubscription attribute.
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
