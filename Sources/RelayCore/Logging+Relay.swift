/// The metadata keys revenue-relay logs with, in one place so dashboards and queries can rely on them.
/// Log messages are constant; what varies goes in metadata under these keys.
public enum LogKey {
    public static let kafkaTopic = "kafka.topic"
    public static let kafkaPartition = "kafka.partition"
    public static let kafkaOffset = "kafka.offset"
    public static let kafkaGroup = "kafka.group"
    public static let kafkaClient = "kafka.client"
    public static let notificationStore = "notification.store"
    public static let notificationApp = "notification.app"
    public static let notificationType = "notification.type"
    public static let notificationId = "notification.id"
    public static let error = "error"
    public static let httpListen = "http.listen"
    public static let role = "relay.role"
}
