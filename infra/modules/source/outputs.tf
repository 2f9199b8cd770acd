output "bucket" {
  description = "The source bucket."
  value       = google_storage_bucket.source.name
}

output "object" {
  description = "The package's object name."
  value       = google_storage_bucket_object.package.name
}
