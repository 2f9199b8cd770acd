output "job" {
  description = "The tick job's name."
  value       = google_cloud_scheduler_job.tick.name
}
