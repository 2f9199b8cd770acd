output "dashboard" {
  description = "The Cloud Monitoring dashboard's id."
  value       = google_monitoring_dashboard.opendws.id
}

output "alert_policies" {
  description = "The alert policies' names: requests waiting too long, reconcile not running."
  value = {
    waiting   = google_monitoring_alert_policy.waiting.name
    reconcile = google_monitoring_alert_policy.reconcile_silent.name
  }
}
