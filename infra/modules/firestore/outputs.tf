output "database" {
  description = "The database's name."
  value       = google_firestore_database.this.name
}
