output "topics" {
  description = "Topic names by role: requests, events, ticks."
  value       = { for key, topic in google_pubsub_topic.topic : key => topic.name }
}

output "topic_ids" {
  description = "Topic ids (projects/P/topics/T) by role: requests, events, ticks."
  value       = { for key, topic in google_pubsub_topic.topic : key => topic.id }
}

output "requests_dead_letter_topic" {
  description = "The dead-letter topic of capacity-requests (its id)."
  value       = google_pubsub_topic.requests_dead_letter.id
}

output "requests_dead_letter_subscription" {
  description = "The subscription holding dead-lettered request messages."
  value       = google_pubsub_subscription.requests_dead_letter.name
}
