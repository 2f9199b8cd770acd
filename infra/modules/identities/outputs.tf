output "emails" {
  description = "Service account emails by key."
  value       = { for key, account in google_service_account.account : key => account.email }
}

output "members" {
  description = "IAM members (serviceAccount:EMAIL) by key."
  value       = { for key, account in google_service_account.account : key => account.member }
}

output "names" {
  description = "Service account resource names (projects/P/serviceAccounts/EMAIL) by key."
  value       = { for key, account in google_service_account.account : key => account.name }
}
