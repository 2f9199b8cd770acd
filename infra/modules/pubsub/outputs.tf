output "topics" {
  description = "Topic names by role: events, ticks, admin_requests, and requests (the shared topic, when made)."
  value = merge(
    { for key, topic in google_pubsub_topic.topic : key => topic.name },
    { admin_requests = google_pubsub_topic.requests["admin"].name },
    { for key, topic in google_pubsub_topic.requests : "requests" => topic.name if key == "shared" },
  )
}

output "topic_ids" {
  description = "Topic ids (projects/P/topics/T) by role: events, ticks."
  value       = { for key, topic in google_pubsub_topic.topic : key => topic.id }
}

output "request_topic_ids" {
  description = "The request topics' ids by whom they speak for: each tenant by name, admin, and shared (when made)."
  value       = { for key, topic in google_pubsub_topic.requests : key => topic.id }
}

output "tenant_request_topics" {
  description = "Each tenant's request topic (capacity-requests-{tenant}) by tenant."
  value       = { for tenant in keys(var.tenants) : tenant => google_pubsub_topic.requests[tenant].name }
}

output "tenant_event_subscriptions" {
  description = "Each tenant's filtered event subscription (capacity-events-{tenant}) by tenant."
  value       = { for tenant, subscription in google_pubsub_subscription.tenant_events : tenant => subscription.name }
}

output "requests_dead_letter_topic" {
  description = "The dead-letter topic of the request topics (its id)."
  value       = google_pubsub_topic.requests_dead_letter.id
}

output "requests_dead_letter_subscription" {
  description = "The subscription holding dead-lettered request messages."
  value       = google_pubsub_subscription.requests_dead_letter.name
}
