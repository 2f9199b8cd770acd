output "url" {
  description = "The function's HTTPS URL."
  value       = google_cloudfunctions2_function.this.url
}

output "service" {
  description = "The Cloud Run service behind the function."
  value       = google_cloudfunctions2_function.this.service_config[0].service
}

output "trigger" {
  description = "The Eventarc trigger's name (null for an HTTP function)."
  value       = var.pubsub_trigger == null ? null : google_cloudfunctions2_function.this.event_trigger[0].trigger
}

output "more_triggers" {
  description = "The further topics' Eventarc triggers (ids) by key."
  value       = { for key, trigger in google_eventarc_trigger.more : key => trigger.id }
}
