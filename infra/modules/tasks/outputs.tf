output "queue" {
  description = "The queue's name."
  value       = google_cloud_tasks_queue.timers.name
}
